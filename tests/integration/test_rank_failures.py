"""Trainer ranks that fail: a rank killed, a rank stopped, ranks that cannot form their group. The
run fails within a bounded time naming the rank, no rank is left waiting on a collective, no process
or /dev/shm entry is left behind, and the last checkpoint stays valid and resumable."""
import os
import signal
import time

import psutil

from orchestrator.run import checkpoint
from tests.integration.lifecycle import (all_gone, descendants, error_lines, run, run_segments, start,
                                         wait_for_step, worker_pids)

RANKS = ["actor.num_ranks=2", "run.total_steps=400", "run.checkpoint_every=3", "eval.every_steps=0",
         "run.progress=false"]
CONFIG = "configs/default.yaml"


def _fails(proc, timeout=90):
    kids = descendants(proc.pid)
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 1, err
    assert all_gone(kids, 5) == []                       # no rank left waiting on a collective
    assert run_segments(proc) == []
    return err


def _resumable(run_dir):
    found = checkpoint.find_resumable(str(run_dir))
    assert found.path is not None and found.skipped == []
    assert os.path.isdir(os.path.join(found.path, "trainer", "dcp"))
    return int(found.state["step"])


def test_killed_rank_fails_the_run_naming_it(tmp_path):
    proc = start(tmp_path, *RANKS, config=CONFIG)
    wait_for_step(proc, tmp_path, 7, timeout=120)
    os.kill(worker_pids(tmp_path)["trainer1"], signal.SIGKILL)
    err = _fails(proc)
    line = error_lines(err)[-1]
    assert "trainer rank 1" in line and "died" in line and "checkpoint stays valid" in line, err
    step = _resumable(tmp_path)
    assert step >= 6
    out = run(tmp_path, *RANKS[:1], f"run.total_steps={step + 2}", "eval.every_steps=0",
              "run.resume=must", config=CONFIG, timeout=180)
    assert out.returncode == 0, out.stderr
    assert f"resumes 1 (at step {step})" in out.stderr


def test_stopped_rank_is_caught_by_the_liveness_deadline(tmp_path):
    """The progress deadline stays at its 600 s default: the stopped rank's own liveness thread
    goes silent with it."""
    proc = start(tmp_path, *RANKS, "actor.liveness_timeout_s=3", config=CONFIG)
    wait_for_step(proc, tmp_path, 4, timeout=120)
    deadline = time.monotonic() + 60             # a committed checkpoint to come back to
    while checkpoint.find_resumable(str(tmp_path)).path is None and time.monotonic() < deadline:
        time.sleep(0.2)
    victim = worker_pids(tmp_path)["trainer1"]
    os.kill(victim, signal.SIGSTOP)
    try:
        err = _fails(proc)
    finally:
        if psutil.pid_exists(victim):
            os.kill(victim, signal.SIGCONT)
    line = error_lines(err)[-1]
    assert "trainer rank 1 stopped answering" in line and "actor.liveness_timeout_s=3" in line, err
    assert "stopped (SIGSTOP)" in line, err
    _resumable(tmp_path)


def test_ranks_that_cannot_form_their_group_fail_at_startup(tmp_path):
    """gloo told to use a network interface that does not exist: every rank fails to join."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="arl-no-such-if0")
    import subprocess
    import sys
    from tests.integration.lifecycle import ROOT
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config", CONFIG,
                             f"run.dir={tmp_path}", *RANKS], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = _fails(proc)
    line = error_lines(err)[-1]
    assert "trainer rank" in line and "failed at startup" in line, err
