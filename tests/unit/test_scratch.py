"""The per-run scratch directory (orchestrator.runtime.scratch): created under the temp dir, removed with
everything in it, and swept at the next launch when its supervisor died (a real dead pid)."""
import os
import subprocess
import sys

from orchestrator.runtime import scratch


def test_create_remove_and_sweep_of_dead_supervisors():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = scratch.create(f"{dead.pid}-abc123")
    live = scratch.create(f"{os.getpid()}-def456")
    try:
        open(os.path.join(gone, "model.safetensors"), "w").close()
        assert os.path.basename(gone) in scratch.sweep_dead()
        assert not os.path.exists(gone) and os.path.isdir(live)
    finally:
        scratch.remove(gone)
        scratch.remove(live)
    assert not os.path.exists(live)
