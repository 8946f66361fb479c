"""The embedded default job with LoRA adapters (issue #25: `actor.lora.rank=8`), deterministic
(run.deterministic, #35), learns through the full async pipeline: the mean reward of the last 50
steps is at least 0.3 above the first 50's, with the merged weights inference samples from checked
every step (logprob_diff), and its checkpoints hold the adapters, not the model. The built-in model
is randomly initialised, so the adapters also target its output head; every other LoRA key is at
its default (#39: alpha sqrt(hidden_size), B at 10x actor.lr, LoRA+ ratio 16). Seeds 0-7 in
README "LoRA"."""
import numpy as np
import pytest

from tests.integration.lifecycle import run_embedded

LORA = ["actor.lora.rank=8", "run.deterministic=true", "run.total_steps=600",  # at 400, seed 5 0.25
        "actor.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"]


@pytest.mark.slow            # 600 steps of the default job, about a minute on 2 busy cores
def test_default_job_learns_with_lora(tmp_path):
    pytest.importorskip("peft")
    cfg, recs, steps = run_embedded(tmp_path, timeout=900, overrides=LORA)
    rewards = np.array([r["reward_mean"] for r in steps])
    first, last = rewards[:50].mean(), rewards[-50:].mean()
    assert last - first >= 0.3, (first, last)
    diffs = [r["logprob_diff_mean"] for r in steps if r.get("logprob_diff_mean") is not None]
    assert diffs and max(diffs) < 1e-3
    trainer = tmp_path / "checkpoints" / f"step_{len(steps):08d}" / "trainer"
    assert sorted(p.name for p in trainer.iterdir()) == ["adapter", "optimizer.pt"]
