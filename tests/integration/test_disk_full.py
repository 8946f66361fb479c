"""Disk full: one line naming the path, exit 1, no logging traceback dump, nothing left in
/dev/shm; after space is freed the run resumes exactly (steps and prompts once each). The run
directory sits on a small tmpfs filled up for real."""
import os
import subprocess

import pytest

from tests.integration.lifecycle import run, run_segments, start, steps, trained_prompt_ids


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_disk_full_is_one_line_and_resume_stays_exact(small_fs):
    run_dir = small_fs / "run"
    common = ["run.checkpoint_every=3", "rollout.filter_zero_std=false",
              "inference.sim.completion_tokens=512", "rollout.max_new_tokens=512"]
    # leave room for a few steps only
    filler = small_fs / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (7 << 20))
    proc = start(run_dir, "run.total_steps=40", *common)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()          # the error, after the run's summary paragraph
    assert len(lines) == 2 and lines[0].startswith("run summary: "), err
    lines = lines[1:]
    assert lines[0].startswith("error: no space left on device writing "), err
    assert str(run_dir) in lines[0]
    assert "Traceback" not in err and "Logging error" not in err
    assert run_segments(proc) == []
    os.remove(filler)
    out = run(run_dir, "run.total_steps=40", "run.resume=auto", *common)
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(run_dir)] == list(range(1, 41))
    assert trained_prompt_ids(run_dir, 40) == list(range(40 * 8))
