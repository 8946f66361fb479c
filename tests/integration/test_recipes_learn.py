"""Each recipe preset (configs/recipes/) learns the default task on CPU through the full async
pipeline: the mean reward of the last 50 steps is at least 0.3 above the first 50's (issue #24).
One preset runs in the default suite (dapo: it also carries the train sink's overlong shaping end
to end); the others are slow-marked. Every step line carries the recipe's own fields."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 200          # the default job runs 800 for its 0.8 target; 0.3 of gain comes well before
WINDOW = 50
FIELDS = {"dapo": ["overlong_cut", "overlong_penalized", "overlong_penalty_mean", "filtered_groups"],
          "grpo": ["kl_ref_mean", "train_kl_ref_loss"]}
DEFAULT_SUITE = "dapo"
RECIPES = sorted(p.stem for p in (ROOT / "configs" / "recipes").glob("*.yaml"))


def _learns(run_dir: Path, name: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config",
                           f"configs/recipes/{name}.yaml", f"run.dir={run_dir}",
                           f"run.total_steps={STEPS}", "eval.every_steps=0", "run.progress=false"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    rewards = np.array([r["reward_mean"] for r in steps])
    first, last = rewards[:WINDOW].mean(), rewards[-WINDOW:].mean()
    assert last - first >= 0.3, (name, first, last)
    for field in FIELDS.get(name, []):
        assert all(field in r for r in steps), field
    if name == "grpo":          # the reference is the initial weights: no KL before the first update
        assert steps[0]["kl_ref_mean"] == 0.0 and steps[-1]["kl_ref_mean"] > 0


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n == DEFAULT_SUITE else [pytest.mark.slow])
                                  for n in RECIPES])
def test_recipe_learns_the_default_task(tmp_path, name):
    _learns(tmp_path / "run", name)
