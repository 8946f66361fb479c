"""SIGTERM/SIGINT: admission stops, a drain window, a checkpoint, then a bounded exit with no child
alive and nothing left in /dev/shm; the run resumes from where it stopped."""
import signal
import time

import pytest

from tests.integration.lifecycle import (all_gone, descendants, run_segments, start, steps,
                                         wait_for_step)

TIMEOUT_S = 4


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_checkpoints_and_exits_within_bound(tmp_path, sig):
    proc = start(tmp_path, "run.total_steps=100000", "run.checkpoint_every=0",
                 f"run.shutdown_timeout_s={TIMEOUT_S}")
    wait_for_step(proc, tmp_path, 4)
    children = descendants(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(sig)
    proc.communicate(timeout=TIMEOUT_S + 10)
    elapsed = time.monotonic() - t0
    assert elapsed <= TIMEOUT_S + 2
    assert proc.returncode == 128 + sig
    assert all_gone(children, timeout=0.5) == []
    assert run_segments(proc) == []
    trained = steps(tmp_path)[-1]["step"]
    latest = (tmp_path / "checkpoints" / "latest").read_text()
    assert latest == f"step_{trained:08d}"          # the drain ended in a checkpoint


def test_slow_drain_is_cut_by_the_window_and_still_bounded(tmp_path):
    # each trainer step takes longer than the whole shutdown budget: the window must cut it
    proc = start(tmp_path, "run.total_steps=100000", "actor.sim.step_time_s=1.5",
                 "run.shutdown_timeout_s=2")
    wait_for_step(proc, tmp_path, 1, timeout=60)
    children = descendants(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert time.monotonic() - t0 <= 2 + 2
    assert proc.returncode == 128 + signal.SIGTERM
    assert all_gone(children, timeout=0.5) == []
    assert run_segments(proc) == []


def test_resume_after_sigterm_continues_without_gap(tmp_path):
    proc = start(tmp_path, "run.total_steps=30", "run.checkpoint_every=0",
                 f"run.shutdown_timeout_s={TIMEOUT_S}", "actor.sim.step_time_s=0.1")
    wait_for_step(proc, tmp_path, 5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=TIMEOUT_S + 10)
    again = start(tmp_path, "run.total_steps=30", "run.resume=must")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    s = steps(tmp_path)
    assert [r["step"] for r in s] == list(range(1, 31))
    assert sum(r["resumed"] for r in s) == 1
