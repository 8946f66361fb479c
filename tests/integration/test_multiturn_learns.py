"""The embedded multi-turn job (configs/multiturn.yaml: the tiny model, the built-in `lookup` tool
task) really learns on CPU through the full async pipeline: it learns to call the tool (every
episode of the last steps calls it and takes two turns) and to answer with the value the tool
returned (last-10 reward above what a call with a chance answer earns, 0.2 + 0.8 * 0.4 = 0.52, by
MARGIN; held-out keys above chance); the head age stays within S on average.
It runs with run.deterministic=true (seed 0), so the figure is a function of the code; a
deterministic run reloads only between waves, so no trajectory spans versions (a free run's
later turns may carry newer versions; no soak asserts that any more). The bounds come from a
sweep (scripts/sweep_soaks.py --soaks multiturn, 2026-12-07, 800 steps, 2 cores): last-10 reward over seeds 0-7 min 0.574 / median 0.885 /
max 0.988, the last eval 0.541 / 0.888 / 0.989 (seed 6 the low one on both: its second digit
collapsed on one value, the "dead digit" of the default job; seed 0 gives 0.836 / 0.765). The low
end sits at the bound: making the recipe robust there is open (issue #35)."""
import numpy as np
import pytest

from tests.integration.lifecycle import run_embedded

pytest.importorskip("torch")
CHANCE = 0.52
MARGIN = 0.05


@pytest.mark.slow            # about 5 min on 2 cores; the exactness and kill/resume tests stay in the default suite
def test_multiturn_job_learns(tmp_path):
    cfg, recs, steps = run_embedded(tmp_path, "configs/multiturn.yaml",
                                    overrides=["run.deterministic=true"])
    rewards = np.array([r["reward_mean"] for r in steps])
    first, last = rewards[:10].mean(), rewards[-10:].mean()
    assert last >= CHANCE + MARGIN and last - first >= 0.5, (first, last)
    episodes = cfg["rollout"]["consumer_batch_size"] * cfg["rollout"]["group_size"]
    tail = steps[-10:]
    assert np.mean([r["tool_calls"] for r in tail]) >= 0.9 * episodes
    assert all(1.9 <= r["turns_mean"] <= cfg["task"]["max_turns"] for r in tail)
    assert all(r["rollouts_rejected"] == 0 for r in steps)
    evals = [r for r in recs if r["kind"] == "eval"]
    assert len(evals) == cfg["run"]["total_steps"] // cfg["eval"]["every_steps"]
    assert evals[-1]["reward_mean"] >= CHANCE     # copies values on held-out keys too
    S = cfg["rollout"]["max_head_offpolicyness"]
    assert np.mean([r["age_mean"] for r in steps]) <= S
    assert all(r["spanning"] == 0 for r in steps)   # deterministic: no reload inside a wave
