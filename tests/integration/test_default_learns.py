"""The embedded default job (configs/default.yaml, what `python -m orchestrator.launch` runs) really
learns on CPU through the full async pipeline: mean reward over the last 10 steps >= 0.8 and at
least 0.5 above the first 10; eval lines are logged; staleness stays within the configured bound
on average."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_default_job_learns(tmp_path):
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load(open(ROOT / "configs" / "default.yaml"))
    recs = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
    steps = [r for r in recs if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, cfg["run"]["total_steps"] + 1))
    rewards = np.array([r["reward_mean"] for r in steps])
    first, last = rewards[:10].mean(), rewards[-10:].mean()
    assert last >= 0.8 and last - first >= 0.5, (first, last)
    evals = [r for r in recs if r["kind"] == "eval"]
    assert len(evals) == cfg["run"]["total_steps"] // cfg["eval"]["every_steps"]
    assert evals[-1]["reward_mean"] >= first + 0.3          # held-out prompts improved too
    S = cfg["rollout"]["max_head_offpolicyness"]
    assert np.mean([r["age_mean"] for r in steps]) <= S
    assert (tmp_path / "checkpoints" / "latest").read_text() == f"step_{len(steps):08d}"
    assert any((tmp_path / "checkpoints" / f"step_{len(steps):08d}" / "trainer").iterdir())
