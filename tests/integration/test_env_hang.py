"""Environments that hang, in real launches (torch backend, the tiny built-in model, a real
environment file): the first step() of the run hangs, either a plain step() that never returns or
an async step() that blocks its loop with time.sleep. Every other episode is healthy (reward 1).
- a stuck plain call is abandoned at task.env_timeout_s and its pool thread replaced: on a one-thread
  pool every later episode still gets its real reward, only the hung one ends limited;
- task.env_on_hang=restart: the worker exits and is restarted, its prompts re-dispatched; every
  trained episode but the hung one is a healthy one and the run's promises hold (audit);
- task.env_on_hang=fail: the run fails with one line naming the environment and the call;
and each launch ends by itself, with nothing left in /dev/shm and no process of its own alive."""
import json
import subprocess
import sys
import time

import psutil
import pytest

from tests.integration.lifecycle import ROOT, all_gone, error_lines, events, run_segments, steps

pytest.importorskip("torch")
pytest.importorskip("datasets")

HANG_ENV = '''
import asyncio
import os
import threading
import time

from orchestrator.envs.base import StepResult


class SyncHang:
    """Plain methods, one model turn, reward 1. The first step() of the run (the one that creates
    `marker`) never returns."""

    def __init__(self, marker: str):
        self.marker = marker

    def first(self):
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, turn):
        if self.first():
            threading.Event().wait()
        return StepResult(done=True)

    def score(self, transcript):
        return 1.0


class RowHang(SyncHang):
    """Every step() of row 3's episodes blocks the environment loop; the other rows are healthy
    (their step awaits 0.2 s: a run that a test can catch between two checkpoints)."""

    def reset(self, row):
        self.prompt = row["prompt"]
        return [{"role": "user", "content": row["prompt"]}]

    async def step(self, turn):
        if self.prompt == "03>":
            time.sleep(3600)                    # row 3 blocks the loop
        await asyncio.sleep(0.2)
        return StepResult(done=True)


class AsyncHang(SyncHang):
    """The same with an async step() that blocks its thread instead of awaiting."""

    async def step(self, turn):
        if self.first():
            time.sleep(3600)
        return StepResult(done=True)
'''
TOTAL = 2
BLOCKS_AT = HANG_ENV.splitlines().index("            time.sleep(3600)") + 1


def _launch(tmp_path, cls, *overrides, timeout=240, rows=40, total=TOTAL, until=None):
    """Run to the end (or until `until(run_dir)` is true: then SIGKILL to the supervisor),
    collecting every process the launch starts; (the process, its stderr, those processes)."""
    (tmp_path / "hang_env.py").write_text(HANG_ENV)
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps({"id": i, "prompt": f"{i:02d}>"}) + "\n" for i in range(rows))
    err = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path / 'run'}", "run.progress=false",
         f"run.total_steps={total}", "run.checkpoint_every=0", "eval.every_steps=0",
         "rollout.group_size=4", "rollout.consumer_batch_size=4", "rollout.max_concurrent_rollouts=8",
         "rollout.max_new_tokens=3", "task.name=dataset", f"task.dataset={tmp_path / 'train.jsonl'}",
         f"task.env={tmp_path / 'hang_env.py'}:{cls}", f"task.env_args={{marker: {tmp_path / 'hung'}}}",
         "task.env_timeout_s=3", *overrides],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, text=True)
    seen, end = {}, time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < end:
            try:
                for p in psutil.Process(proc.pid).children(recursive=True):
                    seen.setdefault(p.pid, p)
            except psutil.NoSuchProcess:
                pass
            if until is not None and until(tmp_path / "run"):
                proc.kill()
                proc.wait(30)
                break
            time.sleep(0.05 if until is not None else 0.2)
        assert proc.poll() is not None, f"the launch did not end within {timeout}s"
    finally:
        if proc.poll() is None:         # a failed test still frees what the launch holds
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    err.seek(0)
    return proc, err.read(), list(seen.values())


def _nothing_left(proc, procs):
    assert run_segments(proc) == []
    assert all_gone(procs, timeout=10) == []


def _trained_rewards(run_dir):
    from orchestrator.run.durable import read_record
    from shm.codec import decode
    out = []
    for step in range(1, TOTAL + 1):
        b = decode(read_record(str(run_dir / "batches" / f"step_{step:08d}.rec")))
        out += b.rewards.tolist()
    return out


def test_a_stuck_plain_call_leaves_healthy_episodes_their_reward(tmp_path):
    proc, err, procs = _launch(tmp_path, "SyncHang", "task.env_workers=1", "task.env_max_stuck_calls=1")
    assert proc.returncode == 0, err[-3000:]
    rewards = _trained_rewards(tmp_path / "run")
    assert len(rewards) == TOTAL * 16 and sorted(rewards)[1:] == [1.0] * (TOTAL * 16 - 1)
    assert sum(s["episodes_limited"] for s in steps(tmp_path / "run")) <= 1     # the hung one
    assert events(tmp_path / "run", "worker_restart") == []
    _nothing_left(proc, procs)


@pytest.mark.parametrize("cls", [pytest.param("SyncHang", marks=pytest.mark.slow), "AsyncHang"])
def test_a_hung_environment_restarts_its_worker(tmp_path, cls):
    proc, err, procs = _launch(tmp_path, cls, "task.env_max_stuck_calls=0")
    assert proc.returncode == 0, err[-3000:]
    (restart,) = events(tmp_path / "run", "worker_restart")
    assert restart["worker"] == 0 and restart["exitcode"] == 75
    log = (tmp_path / "run" / "logs" / "inference0.log").read_text()
    assert f"hang_env.py:{cls}" in log and "task.env_on_hang=restart" in log
    rewards = sorted(_trained_rewards(tmp_path / "run"))
    if cls == "AsyncHang":              # nothing finished on the blocked loop: the group was redone
        assert rewards == [1.0] * (TOTAL * 16)
    else:                               # the hung episode may have ended (limited) before the exit
        assert rewards[1:] == [1.0] * (TOTAL * 16 - 1)
    audit = subprocess.run([sys.executable, "-m", "orchestrator.audit", str(tmp_path / "run")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout[-2000:]
    _nothing_left(proc, procs)


@pytest.mark.parametrize("cls, needle", [
    pytest.param("AsyncHang", "blocked the environment loop for", marks=pytest.mark.slow),
    ("SyncHang", "1 blocking calls still running past task.env_timeout_s=3"),
])
def test_a_hung_environment_fails_the_run_naming_it(tmp_path, cls, needle):
    proc, err, procs = _launch(tmp_path, cls, "task.env_on_hang=fail", "task.env_max_stuck_calls=0")
    assert proc.returncode == 1, err[-3000:]
    (line,) = error_lines(err)
    assert "inference worker 0 failed: EnvHung" in line and f"hang_env.py:{cls}" in line, line
    assert "step() of environment" in line and needle in line, line
    if cls == "AsyncHang":
        assert f"hang_env.py:{BLOCKS_AT} (step)" in line, line         # the line that blocks
    _nothing_left(proc, procs)


def _quarantined_run_ok(run_dir, total):
    """Every step trained, row 3 never, each skipped prompt of it in a step line; audit passes."""
    from orchestrator.config import load_config
    from orchestrator.data.workload import load_prompts
    from orchestrator.run.durable import read_record
    from shm.codec import decode
    lines = steps(run_dir)
    assert [x["step"] for x in lines] == list(range(1, total + 1))
    assert lines[-1]["rows_quarantined"] == 1
    skipped = [p for x in lines for p in x["quarantined_prompts"]]
    task = load_prompts(load_config(run_dir / "config.yaml"))
    assert skipped and all(task.row_at(p) == 3 for p in skipped), skipped   # prompt id = index here
    for step in range(1, total + 1):
        b = decode(read_record(str(run_dir / "batches" / f"step_{step:08d}.rec")))
        assert b.rewards.tolist() == [1.0] * b.n         # healthy episodes only
    audit = subprocess.run([sys.executable, "-m", "orchestrator.audit", str(run_dir)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout[-2000:]


def test_a_row_whose_environment_always_hangs_is_quarantined_and_stays_so_across_resume(tmp_path):
    """#38 item 5: row 3's episodes hang on every call. Before, each epoch restarted the worker
    until the restart budget was spent (exit 1 naming neither the environment nor the row). Now
    its second hang (task.env_hang_limit=2) quarantines it: logged with its prompt, skipped on later
    epochs (counted in the step lines, audit passes), kept across a kill -9 and resume."""
    total = 12                                      # 48 prompts over 8 rows: 6 epochs
    args = ["task.env_hang_limit=2", "run.checkpoint_every=1", "rollout.max_concurrent_rollouts=4"]

    def quarantined_and_saved(run_dir):            # a committed checkpoint has the row out
        out = [x["step"] for x in steps(run_dir) if x.get("rows_quarantined")]
        try:
            latest = int((run_dir / "checkpoints" / "latest").read_text().strip()[len("step_"):])
        except (OSError, ValueError):
            return False
        return bool(out) and out[0] <= latest < total - 1
    proc, err, procs = _launch(tmp_path, "RowHang", *args, rows=8, total=total,
                               until=quarantined_and_saved)
    assert proc.returncode == -9, err[-3000:]
    (q,) = events(tmp_path / "run", "row_quarantined")
    assert q["row"] == 3 and q["hangs"] == 2 and "hang_env.py:RowHang" in q["why"], q
    restarts = events(tmp_path / "run", "worker_restart")
    assert [r["exitcode"] for r in restarts] == [75, 75]
    log = (tmp_path / "run" / "logs" / "supervisor.log").read_text()
    assert "hang_env.py:RowHang' for row 3 (prompt" in log and "(hang 2 of row 3;" in log
    assert "row 3 (prompt" in log and "quarantined: its environment" in log

    proc, err, procs2 = _launch(tmp_path, "RowHang", *args, rows=8, total=total)   # resume=auto
    assert proc.returncode == 0, err[-3000:]
    summary = [x for x in (tmp_path / "run" / "logs" / "supervisor.log").read_text().splitlines()
               if "run summary" in x]
    assert "resumes 1" in summary[-1] and "worker restarts 0;" in summary[-1], summary
    _quarantined_run_ok(tmp_path / "run", total)
    _nothing_left(proc, procs + procs2)
