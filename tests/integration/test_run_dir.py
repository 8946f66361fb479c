"""The run directory's promises: one writer at a time, resume only under a config the checkpoint
can serve, and wrong things where files belong refused with one line (exit 2) before anything
starts."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.lifecycle import ROOT, error_lines, run, start, steps, wait_for_step


def test_second_launch_on_a_live_run_dir_exits_2_naming_the_holder(tmp_path):
    # the first run has 2 minutes of steps left: the second launch meets a live holder even on a
    # busy host; once it is refused, the first is drained with SIGTERM instead of waited for
    first = start(tmp_path, "run.total_steps=400", "actor.sim.step_time_s=0.3")
    wait_for_step(first, tmp_path, 3)
    t0 = time.monotonic()
    second = run(tmp_path, "run.total_steps=60")
    assert time.monotonic() - t0 < 10
    assert second.returncode == 2
    lines = error_lines(second.stderr)
    assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "in use" in lines[0]
    assert first.poll() is None, "the first run ended before the second launch was refused"
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM, err
    done = [r["step"] for r in steps(tmp_path)]
    assert len(done) >= 3 and done == list(range(1, len(done) + 1))   # history intact


def test_lock_is_released_by_a_kill_9(tmp_path):
    first = start(tmp_path, "run.total_steps=400", "actor.sim.step_time_s=0.05")
    wait_for_step(first, tmp_path, 2)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    again = run(tmp_path, "run.total_steps=3", "run.resume=never", "run.overwrite=true")
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("change, field", [
    ("rollout.consumer_batch_size=4", "rollout.consumer_batch_size"),
    ("rollout.group_size=2", "rollout.group_size"),
    ("model.hidden_size=128", "model.hidden_size"),
    ("task.num_train_prompts=500", "task.num_train_prompts"),
    ("run.seed=7", "run.seed"),
])
def test_resume_under_an_incompatible_config_exits_2_naming_both_values(tmp_path, change, field):
    assert run(tmp_path, "run.total_steps=5").returncode == 0
    out = run(tmp_path, "run.total_steps=10", "run.resume=must", change)
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in out.stderr
    new = change.split("=")[1]
    assert new in lines[0]
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 6))   # nothing touched


def test_refused_roll_back_deletes_nothing_and_a_good_one_only_later_checkpoints(tmp_path):
    # every check of the target checkpoint comes before any deletion
    from orchestrator.run import checkpoint
    assert run(tmp_path, "run.total_steps=15", "run.checkpoint_every=5",
               "run.keep_checkpoints=null").returncode == 0
    signatures = {s: (p, os.stat(os.path.join(p, "MANIFEST.json")).st_mtime_ns)
                  for s, p in checkpoint.committed(str(tmp_path))}
    assert sorted(signatures) == [5, 10, 15]
    for change in ("rollout.group_size=2", "run.seed=3"):
        out = run(tmp_path, "run.total_steps=20", "run.resume=must", "run.resume_step=5", change)
        assert out.returncode == 2 and "restore it" in out.stderr and change.split("=")[0] in out.stderr
        assert len(error_lines(out.stderr)) == 1
        assert [s for s, _ in checkpoint.committed(str(tmp_path))] == [15, 10, 5]
        for _, path in checkpoint.committed(str(tmp_path)):
            checkpoint.validate(path)
        assert [r["step"] for r in steps(tmp_path)] == list(range(1, 16))
    out = run(tmp_path, "run.total_steps=12", "run.resume=must", "run.resume_step=10",
              "run.checkpoint_every=0", "run.keep_checkpoints=null")
    assert out.returncode == 0, out.stderr
    assert [s for s, _ in checkpoint.committed(str(tmp_path))] == [12, 10, 5]     # only 15 went
    for step in (5, 10):                                                        # untouched
        path, mtime = signatures[step]
        assert os.stat(os.path.join(path, "MANIFEST.json")).st_mtime_ns == mtime
    assert [r["step"] for r in steps(tmp_path) if r["resumed"]] == [11]
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 13))


def test_resume_with_safe_changes_runs(tmp_path):
    assert run(tmp_path, "run.total_steps=5").returncode == 0
    out = run(tmp_path, "run.total_steps=8", "run.resume=must", "metrics.interval_s=0.2",
              "run.shutdown_timeout_s=5", "eval.every_steps=2", "weights.sync_timeout_s=30")
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 9))


def _launch(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config",
                           "configs/sim.yaml", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("make, needle", [
    (lambda d: os.makedirs(d / "metrics.jsonl"), "metrics.jsonl"),
    (lambda d: (d / "checkpoints").write_text("x"), "checkpoints"),
    (lambda d: (d / "logs").write_text("x"), "logs"),
    (lambda d: os.makedirs(d / "run.lock"), "run.lock"),
])
def test_wrong_things_in_the_run_dir_exit_2(tmp_path, make, needle):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    make(run_dir)
    before = sorted(os.listdir(run_dir))
    out = _launch(f"run.dir={run_dir}", "run.total_steps=3")
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1 and needle in lines[0]
    assert sorted(os.listdir(run_dir)) == before


def test_run_dir_that_is_a_file_or_empty_exits_2(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    out = _launch(f"run.dir={f}")
    assert out.returncode == 2 and "not a directory" in out.stderr
    cwd_ckpt = ROOT / "checkpoints"
    out = _launch("run.dir=")
    assert out.returncode == 2 and "run.dir" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not cwd_ckpt.exists()


def test_read_only_run_dir_exits_2(tmp_path):
    run_dir = tmp_path / "ro"
    run_dir.mkdir()
    # read-only for root too: the immutable attribute (a plain chmod does not stop root)
    if subprocess.run(["chattr", "+i", str(run_dir)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        out = _launch(f"run.dir={run_dir}")
    finally:
        subprocess.run(["chattr", "-i", str(run_dir)], check=True)
    assert out.returncode == 2, out.stderr
    assert "not writable" in out.stderr and str(run_dir) in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert os.listdir(run_dir) == []
