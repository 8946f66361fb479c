"""An inference worker killed mid-run: prompts re-dispatched, worker restarted, run completes;
with inference.on_worker_death=fail the run fails loudly instead."""
import json
import os
import signal

from tests.integration.lifecycle import run_segments, start, steps, wait_for_step, worker_pids

SLOW = ["inference.sim.latency_s=0.05", "actor.sim.step_time_s=0.06"]


def test_killed_inference_worker_is_restarted_and_nothing_is_lost(tmp_path):
    proc = start(tmp_path, "run.total_steps=40", *SLOW)
    wait_for_step(proc, tmp_path, 5)
    victim = worker_pids(tmp_path)["inference0"]
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    s = steps(tmp_path)
    assert [r["step"] for r in s] == list(range(1, 41))
    assert all(r["age_max"] <= 2 for r in s)
    events = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")
              if '"event"' in line]
    assert [(e["event"], e["worker"]) for e in events] == [("worker_restart", 0)]
    assert worker_pids(tmp_path)["inference0"] != victim
    assert run_segments(proc) == []


def test_worker_death_fails_the_run_when_configured(tmp_path):
    proc = start(tmp_path, "run.total_steps=400", "inference.on_worker_death=fail", *SLOW)
    wait_for_step(proc, tmp_path, 3)
    os.kill(worker_pids(tmp_path)["inference1"], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "inference worker 1" in err and "died" in err
    assert run_segments(proc) == []


def test_trainer_death_fails_with_clear_error_and_checkpoint_stays_valid(tmp_path):
    proc = start(tmp_path, "run.total_steps=400", "run.checkpoint_every=2", *SLOW)
    wait_for_step(proc, tmp_path, 5)
    os.kill(worker_pids(tmp_path)["trainer0"], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "trainer worker 0" in err and "checkpoint stays valid" in err
    latest = (tmp_path / "checkpoints" / "latest").read_text()
    assert (tmp_path / "checkpoints" / latest / "supervisor.json").exists()
    assert run_segments(proc) == []
