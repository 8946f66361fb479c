"""metrics.jsonl stays contiguous across any kill: a checkpoint commits only once the step lines
it covers are written and fsynced; a damaged metrics.jsonl is repaired (a line cut by a kill) or
reported (exit 2), never silently continued with a gap."""
import json
import os
import signal
import time

from tests.integration.lifecycle import error_lines, run, start, steps


def test_kill_right_after_a_commit_never_loses_the_steps_it_covers(tmp_path):
    # a slow weight reload delays the step lines; the trainer's save is fast: today the commit
    # lands before the lines of the steps it covers, and a kill then loses them for good
    proc = start(tmp_path, "run.total_steps=400", "run.checkpoint_every=2",
                 "inference.sim.reload_delay_s=0.4", "actor.sim.step_time_s=0.01")
    latest = tmp_path / "checkpoints" / "latest"
    deadline = time.monotonic() + 60
    while not latest.exists() and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    k = int(latest.read_text()[5:])
    assert k >= 2
    assert [r["step"] for r in steps(tmp_path)][:k] == list(range(1, k + 1))
    out = run(tmp_path, "run.total_steps=8", "run.resume=must", "inference.sim.reload_delay_s=0.01")
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 9))


def test_line_cut_by_a_kill_is_repaired(tmp_path):
    assert run(tmp_path, "run.total_steps=10", "run.checkpoint_every=5").returncode == 0
    path = tmp_path / "metrics.jsonl"
    with open(path, "ab") as f:                   # what a kill mid-write leaves
        f.write(b'{"kind": "tick", "version": 10, "in_qu')
    out = run(tmp_path, "run.total_steps=12", "run.resume=must")
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 13))


def test_missing_step_lines_are_reported_not_continued(tmp_path):
    assert run(tmp_path, "run.total_steps=10", "run.checkpoint_every=5").returncode == 0
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    kept = [l for l in lines if json.loads(l).get("step") not in (3, 4) or json.loads(l)["kind"] != "step"]
    path.write_text("".join(kept))
    out = run(tmp_path, "run.total_steps=12", "run.resume=must")
    assert out.returncode == 2
    msg = error_lines(out.stderr)
    assert len(msg) == 1 and "metrics.jsonl" in msg[0] and "3-4" in msg[0]
    assert path.read_text() == "".join(kept)          # left as it was for the user to look at
