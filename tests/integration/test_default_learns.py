"""The embedded default job (configs/default.yaml, what `python -m orchestrator.launch` runs) really
learns on CPU through the full async pipeline: mean reward over the last 10 steps >= 0.8 and at
least 0.5 above the first 10 (a run below 0.8 has three or more "dead" digits, never sampled again
once collapsed; configs/default.yaml's entropy_coef keeps them alive); eval lines are logged;
staleness stays within the configured bound on average. With two trainer ranks (gloo, FSDP2,
micro-batches) it learns the same way. Both run with run.deterministic=true: seeds 0-7 on
2026-12-07 (scripts/sweep_soaks.py), last-10 reward min / median / max 0.913 / 0.999 / 1.000 on one
rank, 0.985 / 0.998 / 0.999 on two, each 8 of 8 above the bound."""
import json

import numpy as np
import pytest

from tests.integration.lifecycle import run_embedded

# the run is a function of the code (run.deterministic, seed 0 of configs/default.yaml), so the
# figure moves only when the code changes what the job learns; the bounds hold on seeds 0-7
DETERMINISTIC = "run.deterministic=true"


# Slow-marked, one rank and two (400 steps, one to two minutes on 2 free cores; the bounds hold over
# the seeds in configs/default.yaml): a learning soak, which `.ci/run` runs after the default
# suite. The default suite's learning check is test_torch_learns (the same model and task, 60
# synchronous steps); it runs 2-rank runs end to end in test_rank_failures and the equivalence of
# the 2-rank step in test_trainer_ranks
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [[], ["actor.num_ranks=2"]], ids=["one-rank", "two-ranks"])
def test_default_job_learns(tmp_path, ranks):
    cfg, recs, steps = run_embedded(tmp_path, timeout=600, overrides=[DETERMINISTIC, *ranks])
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
    if ranks:
        ckpt = tmp_path / "checkpoints" / f"step_{len(steps):08d}" / "trainer"
        assert json.loads((ckpt / "ranks.json").read_text()) == {"world_size": 2, "sharding": "fsdp"}
