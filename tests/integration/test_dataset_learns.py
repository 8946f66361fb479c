"""The default task (copy2) written as JSONL files and trained through the generic dataset path
(task.dataset + the built-in `digits` reward, the built-in tiny model) learns on CPU: the mean
reward of the last 10 steps rises well above the first 10, and the eval lines (task.eval_dataset)
report reward and accuracy."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.integration.lifecycle import ROOT, steps

pytest.importorskip("datasets")
pytest.importorskip("torch")


# slow: a 400-step learning run. The default suite checks the same path more cheaply: the built-in
# copy2 task is a generated dataset on this same PromptSet path with the same `digits` reward, and
# test_default_learns requires it to learn, held-out eval included; JSONL train and eval datasets
# through the launcher (eval lines, samples, accuracy) are test_your_data's.
@pytest.mark.slow
def test_copy2_as_a_jsonl_dataset_learns(tmp_path):
    problems = [{"prompt": f"{i:02d}>", "answer": f"{i:02d}"} for i in range(100)]
    held_out = set(np.random.default_rng(0).choice(100, 20, replace=False).tolist())
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps(p) + "\n" for i, p in enumerate(problems) if i not in held_out)
    with open(tmp_path / "test.jsonl", "w") as f:
        f.writelines(json.dumps(problems[i]) + "\n" for i in sorted(held_out))
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", f"run.dir={run_dir}", "run.total_steps=400",
         "run.progress=false", "run.checkpoint_every=0", "task.name=dataset",
         f"task.dataset={tmp_path / 'train.jsonl'}", f"task.eval_dataset={tmp_path / 'test.jsonl'}",
         "task.reward=digits", "eval.every_steps=200"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert out.returncode == 0, out.stderr[-2000:]
    rewards = np.array([r["reward_mean"] for r in steps(run_dir)])
    assert len(rewards) == 400
    first, last = rewards[:10].mean(), rewards[-10:].mean()
    assert last >= 0.6 and last - first >= 0.4, (first, last)
    evals = [json.loads(x) for x in open(run_dir / "metrics.jsonl") if '"eval"' in x]
    assert [e["step"] for e in evals] == [200, 400] and all(e["samples"] == 20 for e in evals)
    assert evals[-1]["reward_mean"] >= first + 0.2 and 0 <= evals[-1]["accuracy"] <= 1
