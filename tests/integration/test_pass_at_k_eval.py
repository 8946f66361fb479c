"""Eval lines carry pass@k and mean@k for each k of eval.pass_k (issue #37): on the default job,
deterministic, an eval round of 8 samples per prompt at step 150 reports pass@1 equal to its
accuracy (one sample right: the fraction of samples at full reward), pass@k growing with k, and
mean@k equal to its reward_mean (every prompt has n samples)."""
import pytest

from tests.integration.lifecycle import run_embedded

pytest.importorskip("torch")


def test_eval_lines_carry_pass_at_k(tmp_path):
    _, recs, _ = run_embedded(tmp_path, overrides=[
        "run.deterministic=true", "run.total_steps=150", "eval.every_steps=150",
        "eval.samples_per_prompt=8", "eval.pass_k=[1,2,8]"])
    ev = [r for r in recs if r["kind"] == "eval"]
    assert len(ev) == 1
    ev = ev[0]
    assert ev["pass@1"] == pytest.approx(ev["accuracy"], abs=1e-12)
    assert 0 < ev["pass@1"] < ev["pass@2"] < ev["pass@8"] <= 1, ev
    for k in (1, 2, 8):
        assert ev[f"mean@{k}"] == pytest.approx(ev["reward_mean"], abs=1e-9)
