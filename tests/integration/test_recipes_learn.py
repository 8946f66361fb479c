"""Each recipe preset (configs/recipes/) learns the default task on CPU through the full async
pipeline: the mean reward of the last 50 steps is at least 0.3 above the first 50's (issue #24).
All are slow-marked (learning soaks, about a minute each on 2 cores; `.ci/run` runs them): the
default suite checks each recipe's math in tests/unit/test_algo_* and its split invariance on
trainer ranks in test_trainer_ranks. Every step line carries the recipe's own fields.
Each runs with run.deterministic=true (seed 0), so its figure is a function of the code. Sweep of
seeds 0-7 (scripts/sweep_soaks.py, 2026-12-07), gain of the last 50 steps over the first 50, min /
median / max, each 8 of 8 above 0.3: cispo 0.35 / 0.48 / 0.74, dapo 0.33 / 0.40 / 0.68, dr_grpo
0.52 / 0.80 / 0.83, grpo 0.64 / 0.76 / 0.80, gspo 0.74 / 0.78 / 0.82, rloo 0.71 / 0.82 / 0.84."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 200          # the default job runs 400 for its 0.8 target; 0.3 of gain comes well before
# dapo's reward can sit at its start (0.05) for 60-200 steps before it takes off (its dynamic
# sampling trains only the groups that disagree): 200 steps failed twice in four runs on 2026-12-04
# (2026-12-05: at the entropy_coef of 0.02 it had until then, about 1 dapo run in 6 collapsed onto
# one output for every prompt and ended on rollout.max_consecutive_filtered; at 0.1 none of 22 runs
# did, gains 0.31-0.85; configs/recipes/dapo.yaml)
LONGER = {"dapo": 400}
WINDOW = 50
FIELDS = {"dapo": ["overlong_cut", "overlong_penalized", "overlong_penalty_mean", "filtered_groups"],
          "grpo": ["kl_ref_mean", "train_kl_ref_loss"]}
RECIPES = sorted(p.stem for p in (ROOT / "configs" / "recipes").glob("*.yaml"))


def _learns(run_dir: Path, name: str) -> None:
    total = LONGER.get(name, STEPS)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config",
                           f"configs/recipes/{name}.yaml", f"run.dir={run_dir}",
                           f"run.total_steps={total}", "eval.every_steps=0", "run.progress=false",
                           "run.deterministic=true"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, total + 1))
    rewards = np.array([r["reward_mean"] for r in steps])
    first, last = rewards[:WINDOW].mean(), rewards[-WINDOW:].mean()
    assert last - first >= 0.3, (name, first, last)
    for field in FIELDS.get(name, []):
        assert all(field in r for r in steps), field
    if name == "grpo":          # the reference is the initial weights: no KL before the first update
        assert steps[0]["kl_ref_mean"] == 0.0 and steps[-1]["kl_ref_mean"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_recipe_learns_the_default_task(tmp_path, name):
    _learns(tmp_path / "run", name)
