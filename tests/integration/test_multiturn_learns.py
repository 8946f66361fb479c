"""The embedded multi-turn job (configs/multiturn.yaml: the tiny model, the built-in `lookup` tool
task) really learns on CPU through the full async pipeline: it learns to call the tool (every
episode of the last steps calls it and takes two turns) and to answer with the value the tool
returned (reward well above what a call with a chance answer earns, 0.2 + 0.8 * 0.4 = 0.52; on
held-out keys too); trajectories span policy versions and the head age stays within S on average.
Observed last-10 rewards: at 600 steps 0.76-0.99 over seeds 0-3 and reruns of seed 0 here, but
once 0.59 in CI (seed 0: it had learned the call, not yet the copy, and runs are asynchronous, so
one seed varies); the job now runs 800 steps (seed 0: 0.84, 300 s here)."""
import numpy as np
import pytest

from tests.integration.lifecycle import run_embedded

pytest.importorskip("torch")
CHANCE = 0.52


@pytest.mark.slow            # about 5 min on 2 cores; the exactness and kill/resume tests stay in the default suite
def test_multiturn_job_learns(tmp_path):
    cfg, recs, steps = run_embedded(tmp_path, "configs/multiturn.yaml")
    rewards = np.array([r["reward_mean"] for r in steps])
    first, last = rewards[:10].mean(), rewards[-10:].mean()
    assert last >= CHANCE + 0.08 and last - first >= 0.5, (first, last)
    episodes = cfg["rollout"]["consumer_batch_size"] * cfg["rollout"]["group_size"]
    tail = steps[-10:]
    assert np.mean([r["tool_calls"] for r in tail]) >= 0.9 * episodes
    assert all(1.9 <= r["turns_mean"] <= cfg["task"]["max_turns"] for r in tail)
    assert all(r["rollouts_rejected"] == 0 for r in steps)
    evals = [r for r in recs if r["kind"] == "eval"]
    assert len(evals) == cfg["run"]["total_steps"] // cfg["eval"]["every_steps"]
    assert evals[-1]["reward_mean"] >= CHANCE + 0.08     # copies values on held-out keys too
    S = cfg["rollout"]["max_head_offpolicyness"]
    assert np.mean([r["age_mean"] for r in steps]) <= S
    assert sum(r["spanning"] for r in steps) > 0        # later turns carry newer versions
