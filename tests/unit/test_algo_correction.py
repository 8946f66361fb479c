"""orchestrator.algo rollout_correction (TIS / MIS at token, sequence and geometric level) and
kl_penalty (k1, k2, k3), against hand-computed values, with masked and far-off tokens."""
import math

import pytest
import torch

from orchestrator.algo import CORRECTION_LEVELS, CORRECTIONS, kl_penalty, rollout_correction


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# per-token w: sequence 0: 2, 3 (then padding, whose huge ratio must count nowhere); sequence 1: 0.5
BEHAV = torch.zeros(2, 3)
LP = torch.log(_t([[2.0, 3.0, 1e6], [0.5, 1.0, 1.0]]))
MASK = _t([[1, 1, 0], [1, 0, 0]], torch.bool)


def test_tis_token_truncates_each_ratio():
    w, hit, stats = rollout_correction(LP, BEHAV, MASK, "tis", "token", threshold=2.5)
    assert w.flatten().tolist() == pytest.approx([2.0, 2.5, 0.0, 0.5, 0.0, 0.0])
    assert hit.flatten().tolist() == [False, True, False, False, False, False]
    assert stats["weight_mean"] == pytest.approx((2.0 + 2.5 + 0.5) / 3)
    assert stats["hit_frac"] == pytest.approx(1 / 3) and stats["tokens"] == 3


def test_tis_sequence_uses_the_product_of_token_ratios():
    # sequence 0: 2 * 3 = 6 -> 5; sequence 1: 0.5
    w, hit, stats = rollout_correction(LP, BEHAV, MASK, "tis", "sequence", threshold=5.0)
    assert w.flatten().tolist() == pytest.approx([5.0, 5.0, 0.0, 0.5, 0.0, 0.0])
    assert hit.flatten().tolist() == [True, True, False, False, False, False]
    assert stats["hit_frac"] == pytest.approx(2 / 3)


def test_geometric_level_is_the_length_normalised_mean():
    # sequence 0: sqrt(2 * 3) = 2.449; sequence 1: 0.5
    g = math.sqrt(6.0)
    w, _, _ = rollout_correction(LP, BEHAV, MASK, "tis", "geometric", threshold=10.0)
    assert w.flatten().tolist() == pytest.approx([g, g, 0.0, 0.5, 0.0, 0.0])


def test_mis_drops_tokens_outside_the_band_and_keeps_the_weight_inside():
    w, hit, stats = rollout_correction(LP, BEHAV, MASK, "mis", "token", threshold=2.5, threshold_low=0.6)
    # 2.0 kept (weight 2.0), 3.0 above 2.5 dropped, 0.5 below 0.6 dropped
    assert w.flatten().tolist() == pytest.approx([2.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert hit.flatten().tolist() == [False, True, False, True, False, False]
    assert stats["hit_frac"] == pytest.approx(2 / 3)
    assert stats["weight_mean"] == pytest.approx(2.0 / 3)


def test_mis_sequence_drops_the_whole_sequence():
    w, hit, _ = rollout_correction(LP, BEHAV, MASK, "mis", "sequence", threshold=5.0)
    # sequence 0 (w = 6) dropped whole; sequence 1 (0.5) kept: threshold_low defaults to 0
    assert w.flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5, 0.0, 0.0])
    assert hit.flatten().tolist() == [True, True, False, False, False, False]


def test_ratios_far_from_one_stay_finite_or_are_dropped():
    lp = _t([[80.0, 80.0], [-80.0, 0.0]])             # a sequence ratio of e^160 overflows float32
    mask = torch.ones(2, 2, dtype=torch.bool)
    w, _, stats = rollout_correction(lp, torch.zeros(2, 2), mask, "tis", "sequence", threshold=2.0)
    assert w.flatten().tolist() == pytest.approx([2.0, 2.0, math.exp(-80.0), math.exp(-80.0)])
    w, hit, _ = rollout_correction(lp, torch.zeros(2, 2), mask, "mis", "sequence", threshold=2.0,
                                   threshold_low=0.5)
    assert w.flatten().tolist() == [0.0, 0.0, 0.0, 0.0] and bool(hit.all())
    assert math.isfinite(stats["weight_mean"])


@pytest.mark.parametrize("mode", list(CORRECTIONS))
@pytest.mark.parametrize("level", list(CORRECTION_LEVELS))
def test_on_policy_weights_are_one_and_nothing_is_hit(mode, level):
    lp = -torch.rand(3, 4)
    mask = torch.rand(3, 4) > 0.3
    w, hit, stats = rollout_correction(lp, lp, mask, mode, level, threshold=2.0)
    assert torch.equal(w, mask.float()) and not bool(hit.any())
    assert stats["weight_mean"] == 1.0 and stats["hit_frac"] == 0.0


def test_empty_mask_and_no_gradient():
    lp = torch.zeros(1, 2, requires_grad=True)
    w, hit, stats = rollout_correction(lp, torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool),
                                       "tis", "geometric", threshold=2.0)
    assert w.tolist() == [[0.0, 0.0]] and not w.requires_grad
    assert stats == {"weight_mean": 1.0, "hit_frac": 0.0, "tokens": 0.0}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown rollout correction 'icepop'"):
        rollout_correction(LP, BEHAV, MASK, "icepop", "token", threshold=2.0)
    with pytest.raises(ValueError, match="level 'turn'"):
        rollout_correction(LP, BEHAV, MASK, "tis", "turn", threshold=2.0)
    with pytest.raises(ValueError, match="threshold_low"):
        rollout_correction(LP, BEHAV, MASK, "tis", "token", threshold=2.0, threshold_low=0.5)
    with pytest.raises(ValueError, match="threshold"):
        rollout_correction(LP, BEHAV, MASK, "mis", "token", threshold=2.0, threshold_low=3.0)


# ---------------------------------------------------------------- KL
def test_kl_estimators_by_hand():
    lp = _t([-1.0, -2.0, -0.5])
    ref = _t([-1.5, -1.0, -0.5])
    d = [0.5, -1.0, 0.0]
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx(d)
    assert kl_penalty(lp, ref, "k2").tolist() == pytest.approx([x * x / 2 for x in d])
    assert kl_penalty(lp, ref, "k3").tolist() == pytest.approx([math.exp(-x) - 1 + x for x in d])


def test_k3_is_clamped_and_its_gradient_finite_far_off_the_reference():
    lp = _t([-100.0, 0.0, 0.0]).requires_grad_()
    ref = _t([0.0, 0.0, -3.0])
    k3 = kl_penalty(lp, ref, "k3")
    # d = -100 -> exp(100) far above 10: clamped; d = 3: e^-3 - 1 + 3 = 2.0498
    assert k3.tolist() == pytest.approx([10.0, 0.0, math.exp(-3) + 2])
    k3.sum().backward()
    assert torch.isfinite(lp.grad).all()
    assert lp.grad.tolist() == pytest.approx([0.0, 0.0, 1 - math.exp(-3)])


def test_k2_gradient_is_the_log_ratio():
    lp = _t([-1.0, -2.0]).requires_grad_()
    kl_penalty(lp, _t([-1.5, -1.0]), "k2").sum().backward()
    assert lp.grad.tolist() == pytest.approx([0.5, -1.0])


def test_unknown_kl_is_named():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'.*k1"):
        kl_penalty(LP, LP, "k4")
