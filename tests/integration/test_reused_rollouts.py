"""Finished rollouts saved with a checkpoint and reused after a resume keep their per-group scalars:
a kill -9 after a checkpoint that holds saved groups, a resume from it, and the first step lines
after the resume count every reward error of the reused groups (`reward_errors`), as the multi-turn
fields are carried by the same scalars."""
import json
import os
import signal
import time

import psutil

from orchestrator.run import checkpoint
from tests.integration.lifecycle import events, run, start, steps

ALWAYS_FAILS = '''
def score(completion, row, ids):
    raise RuntimeError("the reward service is down")
'''
B, G = 8, 16                     # configs/default.yaml: consumer_batch_size, group_size


def _saved_groups_checkpoint(run_dir, proc, timeout=180.0):
    """Step of the first committed checkpoint that holds saved (finished, untrained) groups."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        for step, path in sorted(checkpoint.committed(str(run_dir))):
            try:
                state = checkpoint.validate(path)
            except (checkpoint.CheckpointError, OSError):
                continue                        # pruned or replaced under our feet
            if state.get("reuse"):
                return step
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint with saved rollouts in {timeout}s")


def test_reused_rollouts_keep_their_reward_errors_after_a_kill(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"{i:02d}>", "answer": f"{i:02d}"})
                                              + "\n" for i in range(20)))
    (tmp_path / "r.py").write_text(ALWAYS_FAILS)
    args = ["task.name=dataset", f"task.dataset={tmp_path / 'd.jsonl'}",
            f"task.reward={tmp_path / 'r.py'}:score", "task.reward_on_error=zero",
            "eval.every_steps=0", "run.progress=false", "run.checkpoint_every=2",
            "run.keep_checkpoints=null"]
    run_dir = tmp_path / "run"
    proc = start(run_dir, *args, "run.total_steps=400", config="configs/default.yaml")
    try:
        k = _saved_groups_checkpoint(run_dir, proc)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        psutil.wait_procs(children, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    out = run(run_dir, *args, "run.resume=must", f"run.resume_step={k}", f"run.total_steps={k + 3}",
              config="configs/default.yaml", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    resumes = events(run_dir, "resume")
    assert resumes[-1]["step"] == k and resumes[-1]["reused"] > 0, resumes
    lines = steps(run_dir)
    assert [r["step"] for r in lines] == list(range(1, k + 4))
    # every reward call fails and scores 0: every sample of every batch is one reward error,
    # reused groups included
    assert [r["reward_errors"] for r in lines] == [B * G] * (k + 3)
