"""Issue #22 item 16: a killed vLLM worker left its engine's shared memory (`vllm_dist_<hex>-...`
in /dev/shm, named after its rendezvous file) and the rendezvous file in the temp dir. The engine's
temporary files now live in the worker's home in the run's scratch directory, and what is named
after them is unlinked when the home's worker is dead (at the next engine start) or the run ends;
entries named after anything else stay. Real files in /dev/shm, a real dead pid."""
import os
import subprocess
import sys
import uuid

import pytest

from orchestrator.runtime import scratch

pytestmark = pytest.mark.skipif(not os.path.isdir(scratch.SHM_DIR), reason="no /dev/shm")


def _engine_files(home: str) -> list[str]:
    """A rendezvous file in `home` and the two /dev/shm entries vLLM names after it."""
    ident = f"{scratch.ENGINE_PREFIX}{uuid.uuid4().hex}"
    open(os.path.join(home, ident), "w").close()
    shm = [os.path.join(scratch.SHM_DIR, f"{ident}-tp-[0-1]-cpushm_{r}") for r in (0, 1)]
    for path in shm:
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
    return shm


def test_a_dead_workers_engine_is_released_and_others_kept(monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = scratch.create(f"{os.getpid()}-{uuid.uuid4().hex[:6]}")
    foreign = os.path.join(scratch.SHM_DIR, f"{scratch.ENGINE_PREFIX}{uuid.uuid4().hex}-x-cpushm_0")
    open(foreign, "wb").close()                      # another run's or program's engine
    try:
        gone_home = os.path.join(run, f"engine-{dead.pid}")
        os.makedirs(gone_home)
        gone = _engine_files(gone_home)
        monkeypatch.setenv(scratch.ENV, run)
        home = scratch.engine_home()
        assert home == os.path.join(run, f"engine-{os.getpid()}") and os.path.isdir(home)
        assert not os.path.exists(gone_home) and not any(os.path.exists(p) for p in gone)
        mine = _engine_files(home)
        assert scratch.engine_home() == home and all(os.path.exists(p) for p in mine)  # alive: kept
        scratch.remove(run)                          # the run ends: everything named after it
        assert not os.path.exists(run) and not any(os.path.exists(p) for p in mine)
        assert os.path.exists(foreign)
    finally:
        scratch.remove(run)
        os.unlink(foreign)


def test_no_home_outside_a_run(monkeypatch):
    monkeypatch.delenv(scratch.ENV, raising=False)
    assert scratch.engine_home() is None
