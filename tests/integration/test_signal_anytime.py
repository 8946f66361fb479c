"""A signal at any moment exits 128+signal within run.shutdown_timeout_s + 2 s, with no traceback
and nothing left: during startup (before and while workers come up), during resume recovery (a
slow weight reload), and when systemd/Slurm send SIGTERM to the whole process group (that drains
and checkpoints like a SIGTERM to the supervisor alone)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.lifecycle import ROOT, run, signal_and_check, steps, wait_for_step

BOUND = 3


def _start(run_dir, *overrides):
    return subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config",
                             "configs/sim.yaml", f"run.dir={run_dir}",
                             f"run.shutdown_timeout_s={BOUND}", *overrides],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _signal_and_check(proc, sig, to_group=False, settle=0.0):
    return signal_and_check(proc, sig, BOUND, to_group, settle)


def _wait_for_handlers(proc, timeout=30.0):
    """Until the launcher's first statement has installed its SIGTERM handler (the process's caught
    signals in /proc): the earliest instant code of ours runs. Before it the interpreter is still
    starting (site and .pth files), where a signal has Python's default effect for any program."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as f:
            caught = next(int(x.split()[1], 16) for x in f if x.startswith("SigCgt:"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.001)
    raise AssertionError("the launcher installed no SIGTERM handler")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8])
def test_signal_during_startup(tmp_path, sig, delay):
    proc = _start(tmp_path, "run.total_steps=100")
    _wait_for_handlers(proc)                                # the delay counts from there
    err = _signal_and_check(proc, sig, settle=delay)       # one line (after the run's summary
    lines = err.strip().splitlines()                         # paragraph when a step was trained)
    assert len([x for x in lines if not x.startswith("run summary: ")]) <= 1, err


def test_signal_during_resume_recovery_with_a_slow_reload(tmp_path):
    assert run(tmp_path, "run.total_steps=5").returncode == 0
    proc = _start(tmp_path, "run.total_steps=10", "run.resume=must",
                  "inference.sim.reload_delay_s=30")
    pids = tmp_path / "logs" / "pids.json"
    before = pids.read_text()
    deadline = time.monotonic() + 30           # the resumed run's workers are spawned
    while time.monotonic() < deadline and pids.read_text() == before:
        time.sleep(0.02)
    deadline = time.monotonic() + 5            # and reloading weights (30 s each)
    while time.monotonic() < deadline and "reloading weights" not in _log(tmp_path):
        time.sleep(0.02)
    _signal_and_check(proc, signal.SIGTERM, settle=0.3)
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 6))


def _log(run_dir):
    try:
        return open(os.path.join(run_dir, "logs", "supervisor.log")).read()
    except FileNotFoundError:
        return ""


def test_sigterm_to_the_process_group_drains_and_checkpoints(tmp_path):
    proc = _start(tmp_path, "run.total_steps=100000", "run.checkpoint_every=0")
    wait_for_step(proc, tmp_path, 4)
    _signal_and_check(proc, signal.SIGTERM, to_group=True)
    trained = steps(tmp_path)[-1]["step"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == f"step_{trained:08d}"
    for name in ("trainer0", "inference0", "inference1"):
        assert "fatal" not in open(tmp_path / "logs" / f"{name}.log").read()
