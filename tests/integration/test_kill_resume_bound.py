"""kill -9 with the hard age bound on (rollout.max_observed_offpolicyness = M): on a long-tailed sim
run where the bound aborts rollouts in flight and drops finished ones, kills in steady state, at
checkpoints and during recovery still leave every prompt trained exactly once, and no trained
token's head is older than M in any batch, those trained right after a resume included (reused
rollouts saved with a checkpoint are judged by the same bound)."""
import json

import pytest

from tests.integration.lifecycle import steps
from tests.integration.test_age_bound import head_ages
from tests.integration.lifecycle import soak

M = 3


# a soak, slow-marked like the dataset and multi-turn ones; its exactness sibling (the hard bound
# on a long-tailed run, test_age_bound) stays in the default suite
@pytest.mark.slow
def test_kill_resume_soak_with_the_hard_bound(tmp_path):
    total = 40
    out, result = soak(tmp_path, "--kills", "3", "--seed", "3", "--phases",
                       "steady,checkpoint,recovery", "--hang-timeout", "40", "--timeout", "120",
                       f"run.total_steps={total}", "run.checkpoint_every=4", "run.seed=0",
                       "inference.sim.latency=lognormal", "inference.sim.latency_s=0.1",
                       "inference.sim.lognormal_sigma=1.5", "actor.sim.step_time_s=0.05",
                       "rollout.max_concurrent_rollouts=64", "rollout.filter_zero_std=false",
                       f"rollout.max_observed_offpolicyness={M}")
    assert out.returncode == 0 and result["ok"], json.dumps(result["failures"], indent=1) + out.stderr
    assert result["resumes"] >= 1 and any(r["killed"] for r in result["rounds"])
    assert result["steps_contiguous"] and result["final_step_is_target"]
    assert result["prompts_exactly_once"] and result["shm_leftovers"] == []
    ages = head_ages(tmp_path / "run", total)
    assert ages.size == total * 8 and ages.max() <= M
    lines = steps(tmp_path / "run")
    assert max(x["age_max"] for x in lines) <= M
    assert sum(x["aborted"] + x["dropped"] for x in lines) > 0        # the bound had work to do
