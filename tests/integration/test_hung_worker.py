"""A hung worker is noticed: a trainer stopped with SIGSTOP fails the run naming it (exit 1, last
checkpoint valid); a stopped inference worker is killed and handled like a dead one (prompts
re-dispatched, restarted) instead of failing the run on the weight-sync timeout. A stopped process is
noticed by its liveness deadline even where a step may legitimately outlast it, and a slow step is
not mistaken for a stopped process."""
import os
import signal
import time

import pytest

from tests.integration.lifecycle import (all_gone, descendants, events, run, run_segments, start,
                                         steps, trained_prompt_ids, wait_for_step, worker_pids)

SLOW = ["inference.sim.latency_s=0.05", "actor.sim.step_time_s=0.05"]


def _stop_and_wait(proc, pid, timeout):
    """SIGSTOP worker `pid`, then wait for the launch to end; its stderr."""
    os.kill(pid, signal.SIGSTOP)
    try:
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stopped_trainer_fails_the_run_naming_it(tmp_path):
    proc = start(tmp_path, "run.total_steps=400", "run.checkpoint_every=2",
                 "actor.heartbeat_timeout_s=2", *SLOW)
    wait_for_step(proc, tmp_path, 4)
    children = descendants(proc.pid)
    trainer = worker_pids(tmp_path)["trainer0"]
    os.kill(trainer, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - t0 < 2 + 12           # deadline + bounded shutdown
    assert proc.returncode == 1
    line = [l for l in err.splitlines() if l.startswith("error")]
    assert len(line) == 1 and "trainer worker 0" in line[0] and "no progress" in line[0]
    assert f"pid {trainer}" in line[0] and "Traceback" not in err
    assert all_gone(children, timeout=5.0) == [] and run_segments(proc) == []
    again = run(tmp_path, "run.total_steps=12", "run.resume=must", "run.checkpoint_every=2", *SLOW)
    assert again.returncode == 0, again.stderr
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 13))


@pytest.mark.parametrize("deadline, limit_s, overrides", [
    ("progress", 1.5, ["inference.heartbeat_timeout_s=1.5", "weights.sync_timeout_s=20"]),
    ("liveness", 2.0, ["inference.heartbeat_timeout_s=600", "inference.liveness_timeout_s=2",
                       "weights.sync_timeout_s=60"])])
def test_stopped_inference_worker_is_restarted(tmp_path, deadline, limit_s, overrides):
    """Caught by the progress deadline, or by the liveness deadline alone (progress at 600 s)."""
    proc = start(tmp_path, "run.total_steps=30", "rollout.filter_zero_std=false", *overrides, *SLOW)
    wait_for_step(proc, tmp_path, 4)
    victim = worker_pids(tmp_path)["inference1"]
    err = _stop_and_wait(proc, victim, timeout=90)
    assert proc.returncode == 0, err
    restarts = events(tmp_path, "worker_restart")
    assert [(e["worker"], e["hung"], e["hung_s"] >= limit_s) for e in restarts] == [(1, deadline, True)]
    assert worker_pids(tmp_path)["inference1"] != victim
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 31))
    assert trained_prompt_ids(tmp_path, 30) == list(range(30 * 8))
    assert run_segments(proc) == []


def test_stopped_trainer_is_noticed_by_liveness_while_slow_steps_are_not(tmp_path):
    """Each step takes 2.5 s, longer than actor.liveness_timeout_s=2, and the progress deadline is
    its 600 s default: steps go on (the liveness word is stamped by a thread of its own) until the
    trainer is stopped, which fails the run naming the liveness deadline."""
    proc = start(tmp_path, "run.total_steps=400", "run.checkpoint_every=2",
                 "actor.liveness_timeout_s=2", "inference.sim.latency_s=0.05",
                 "actor.sim.step_time_s=2.5")
    wait_for_step(proc, tmp_path, 3, timeout=60)
    children = descendants(proc.pid)
    trainer = worker_pids(tmp_path)["trainer0"]
    err = _stop_and_wait(proc, trainer, timeout=60)
    assert proc.returncode == 1, err
    line = [l for l in err.splitlines() if l.startswith("error")]
    assert len(line) == 1 and f"trainer worker 0 (pid {trainer}) stopped answering" in line[0], err
    assert "actor.liveness_timeout_s=2" in line[0]
    assert all_gone(children, timeout=5.0) == [] and run_segments(proc) == []
