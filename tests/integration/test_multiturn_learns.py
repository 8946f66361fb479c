"""The embedded multi-turn job (configs/multiturn.yaml: the tiny model, the built-in `lookup` tool
task) really learns on CPU through the full async pipeline: it learns to call the tool (every
episode of the last steps calls it and takes two turns) and to answer with the value the tool
returned (reward above what a call with a chance answer earns, 0.2 + 0.8 * 0.4 = 0.52, by MARGIN;
on held-out keys too); trajectories span policy versions and the head age stays within S on
average.
The bound comes from a sweep over seeds (the launch scripts/sweep_soaks.py --soaks multiturn makes,
2026-12-06, 800 steps, 2 cores): last-10 reward over seeds 0-7 min 0.675 / median 0.849 / max 0.997; with ppo_epochs 4 and
entropy_coef 0.06, 0.679 / 0.896 / 0.978 (no better at the low end, so the config stays). The low
runs copy the first digit and leave the second collapsed on one value (the "dead digit" of the
default job); runs are asynchronous, so one seed varies by machine: CI once ended seed 0 at 0.598,
which gives 0.997 here. MARGIN 0.05 keeps 0.1 below the sweep's minimum; a deterministic run
(issue #35) is what will make this figure a function of the code."""
import numpy as np
import pytest

from tests.integration.lifecycle import run_embedded

pytest.importorskip("torch")
CHANCE = 0.52
MARGIN = 0.05


@pytest.mark.slow            # about 5 min on 2 cores; the exactness and kill/resume tests stay in the default suite
def test_multiturn_job_learns(tmp_path):
    cfg, recs, steps = run_embedded(tmp_path, "configs/multiturn.yaml")
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
    assert evals[-1]["reward_mean"] >= CHANCE + MARGIN   # copies values on held-out keys too
    S = cfg["rollout"]["max_head_offpolicyness"]
    assert np.mean([r["age_mean"] for r in steps]) <= S
    assert sum(r["spanning"] for r in steps) > 0        # later turns carry newer versions
