"""Heavy imports only where used: a sim run (no model) never imports torch or transformers, in the
supervisor or in any worker (`-X importtime` reaches the spawned workers too)."""
import subprocess
import sys

from tests.integration.lifecycle import ROOT


def test_sim_run_imports_no_torch(tmp_path):
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.launch", "--config",
                          "configs/sim.yaml", f"run.dir={tmp_path}", "run.total_steps=3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    modules = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines()
               if line.startswith("import time:") and "|" in line}
    assert "orchestrator.runtime.trainer_worker" in modules and "orchestrator.runtime.inference_worker" in modules
    assert not {"torch", "transformers"} & modules, sorted({"torch", "transformers"} & modules)
