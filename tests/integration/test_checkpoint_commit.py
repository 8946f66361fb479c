"""A kill at any instant of a checkpoint commit leaves a resumable run: resume takes the newest
complete checkpoint whatever `latest` says, and a commit succeeds over whatever a killed commit (or
a rolled-back run) left under its name. The damaged states are made for real on disk."""
import os
import shutil

from tests.integration.lifecycle import run, steps, trained_prompt_ids

COMMON = ["run.checkpoint_every=5", "rollout.filter_zero_std=false"]


def _ckpt(run_dir, step):
    return run_dir / "checkpoints" / f"step_{step:08d}"


def _finish_and_check(run_dir, total):
    out = run(run_dir, f"run.total_steps={total}", "run.resume=must", *COMMON)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert [r["step"] for r in steps(run_dir)] == list(range(1, total + 1))
    assert trained_prompt_ids(run_dir, total) == list(range(total * 8))
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{total:08d}"
    return out


def test_latest_left_behind_by_a_kill_between_rename_and_latest(tmp_path):
    # the state a kill leaves between `rename step_15.partial -> step_15` and the write of latest
    assert run(tmp_path, "run.total_steps=15", *COMMON).returncode == 0
    (tmp_path / "checkpoints" / "latest").write_text("step_00000010")
    out = _finish_and_check(tmp_path, 25)
    resumed = [r["step"] for r in steps(tmp_path) if r["resumed"]]
    assert resumed == [16]                     # the newest complete checkpoint, not latest's
    assert "latest" in out.stderr and "step_00000015" in out.stderr   # warned


def test_commit_over_a_directory_a_killed_commit_left(tmp_path):
    # an older run's step_20 that never got its manifest (a crash before the commit completed)
    # sits where the resumed run commits step 20: skipped on resume, replaced by the commit
    assert run(tmp_path, "run.total_steps=20", *COMMON).returncode == 0
    os.remove(_ckpt(tmp_path, 20) / "MANIFEST.json")
    out = _finish_and_check(tmp_path, 25)
    assert "skipped damaged checkpoint" in out.stderr
    assert [r["step"] for r in steps(tmp_path) if r["resumed"]] == [16]
    assert (_ckpt(tmp_path, 20) / "MANIFEST.json").exists()


def test_missing_latest_resumes_instead_of_deleting_the_checkpoints(tmp_path):
    assert run(tmp_path, "run.total_steps=10", *COMMON).returncode == 0
    os.remove(tmp_path / "checkpoints" / "latest")
    _finish_and_check(tmp_path, 15)
    assert [r["step"] for r in steps(tmp_path) if r["resumed"]] == [11]


def test_rolled_back_latest_and_a_stale_partial(tmp_path):
    # a user pointed latest back at step 5, and a killed save left step_10.partial behind
    assert run(tmp_path, "run.total_steps=10", *COMMON).returncode == 0
    shutil.copytree(_ckpt(tmp_path, 10), str(_ckpt(tmp_path, 10)) + ".partial")
    shutil.rmtree(_ckpt(tmp_path, 10))
    (tmp_path / "checkpoints" / "latest").write_text("step_00000005")
    _finish_and_check(tmp_path, 15)
    assert [r["step"] for r in steps(tmp_path) if r["resumed"]] == [6]


def test_roll_back_with_resume_step(tmp_path):
    # the explicit way back: resume from step 5, later checkpoints dropped, steps and prompts once
    assert run(tmp_path, "run.total_steps=15", *COMMON).returncode == 0
    out = run(tmp_path, "run.total_steps=20", "run.resume=must", "run.resume_step=5", *COMMON)
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(tmp_path) if r["resumed"]] == [6]
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 21))
    assert trained_prompt_ids(tmp_path, 20) == list(range(20 * 8))
    bad = run(tmp_path, "run.total_steps=25", "run.resume=must", "run.resume_step=7", *COMMON)
    assert bad.returncode == 2 and "run.resume_step=7" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
