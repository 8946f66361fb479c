"""orchestrator.algo.loss.ppo_loss: standard clip, decoupled objective, behaviour-weight cap, masking."""
import math

import pytest
import torch

from orchestrator.algo.loss import ppo_loss


def _t(values):
    return torch.tensor(values, dtype=torch.float32)


def test_on_policy_loss_is_minus_mean_advantage_and_gradient_is_policy_gradient():
    lp = _t([-1.0, -2.0, -0.5]).requires_grad_()
    adv = _t([1.0, -2.0, 3.0])
    mask = torch.tensor([1, 1, 0], dtype=torch.uint8)
    for decoupled in (False, True):
        lp.grad = None
        loss, stats = ppo_loss(lp, lp.detach(), lp.detach(), adv, mask, 0.2, decoupled, 5.0)
        assert loss.item() == pytest.approx(-(1.0 - 2.0) / 2)
        loss.backward()
        # d/dlp of -A * exp(lp - c) at lp == c is -A, divided by the 2 masked tokens
        assert torch.allclose(lp.grad, _t([-0.5, 1.0, 0.0]))
        assert stats["tokens"] == 2 and stats["clip_frac"] == 0.0
        assert stats["imp_weight_mean"] == pytest.approx(1.0)


def test_standard_clip_uses_behaviour_and_ignores_proximal():
    behav = _t([-1.0, -1.0])
    lp = (behav + _t([0.5, -0.5])).requires_grad_()   # ratios e^0.5 (~1.65) and e^-0.5 (~0.61)
    adv = _t([1.0, 1.0])
    mask = torch.ones(2, dtype=torch.bool)
    loss, stats = ppo_loss(lp, None, behav, adv, mask, 0.2, False, None)
    # token 0: positive advantage, ratio above 1.2 -> clipped at 1.2, no gradient
    # token 1: positive advantage, ratio below 0.8 -> unclipped branch is the max
    expect = -(1.2 + math.exp(-0.5)) / 2
    assert loss.item() == pytest.approx(expect, rel=1e-6)
    assert stats["clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert lp.grad[0].item() == 0.0
    assert lp.grad[1].item() == pytest.approx(-math.exp(-0.5) / 2, rel=1e-6)
    # the proximal tensor must not matter in standard mode
    loss2, _ = ppo_loss(lp, behav + 3.0, behav, adv, mask, 0.2, False, None)
    assert loss2.item() == pytest.approx(expect, rel=1e-6)


def test_negative_advantage_clips_below():
    behav = _t([-1.0])
    lp = (behav - 0.5).requires_grad_()                # ratio ~0.61 < 0.8
    loss, stats = ppo_loss(lp, None, behav, _t([-1.0]), torch.ones(1), 0.2, False, None)
    assert loss.item() == pytest.approx(0.8)
    assert stats["clip_frac"] == 1.0
    loss.backward()
    assert lp.grad.item() == 0.0


def test_decoupled_ratio_against_proximal_times_behaviour_weight():
    behav = _t([-2.0, -2.0])
    prox = _t([-1.5, -2.3])                            # weights e^0.5 and e^-0.3
    lp = prox.clone().requires_grad_()                 # ratio vs proximal is exactly 1
    adv = _t([2.0, -1.0])
    mask = torch.ones(2, dtype=torch.bool)
    loss, stats = ppo_loss(lp, prox, behav, adv, mask, 0.2, True, 5.0)
    w0, w1 = math.exp(0.5), math.exp(-0.3)
    assert loss.item() == pytest.approx((-2.0 * w0 + 1.0 * w1) / 2, rel=1e-6)
    assert stats["imp_weight_mean"] == pytest.approx((w0 + w1) / 2, rel=1e-6)
    loss.backward()
    assert torch.allclose(lp.grad, _t([-2.0 * w0 / 2, 1.0 * w1 / 2]))
    # the same tensors in standard mode: ratio vs behaviour (e^0.5 clipped, e^-0.3 unclipped)
    std, _ = ppo_loss(prox, prox, behav, adv, mask, 0.2, False, 5.0)
    assert std.item() == pytest.approx((-2.0 * 1.2 + 1.0 * max(w1, 0.8)) / 2, rel=1e-6)


def test_decoupled_equals_standard_when_proximal_is_behaviour():
    g = torch.Generator().manual_seed(0)
    behav = -torch.rand(4, 6, generator=g) * 3
    lp = behav + 0.3 * torch.randn(4, 6, generator=g)
    adv = torch.randn(4, 1, generator=g).expand(4, 6)
    mask = torch.rand(4, 6, generator=g) > 0.3
    a, sa = ppo_loss(lp, behav, behav, adv, mask, 0.2, True, 5.0)
    b, sb = ppo_loss(lp, None, behav, adv, mask, 0.2, False, 5.0)
    assert a.item() == pytest.approx(b.item(), rel=1e-6)
    assert sa["clip_frac"] == sb["clip_frac"]


def test_cap_masks_tokens_out_of_numerator_but_not_denominator():
    behav = _t([-5.0, -1.0])
    prox = _t([-1.0, -1.0])                            # token 0 weight e^4 ~ 54.6 > cap
    lp = prox.clone().requires_grad_()
    adv = _t([1.0, 1.0])
    mask = torch.ones(2, dtype=torch.bool)
    loss, stats = ppo_loss(lp, prox, behav, adv, mask, 0.2, True, 5.0)
    assert loss.item() == pytest.approx(-1.0 / 2)
    assert stats["behav_capped_frac"] == pytest.approx(0.5)
    loss.backward()
    assert lp.grad[0].item() == 0.0
    # no cap: the large weight is used as is
    uncapped, _ = ppo_loss(lp, prox, behav, adv, mask, 0.2, True, None)
    assert uncapped.item() == pytest.approx(-(math.exp(4.0) + 1.0) / 2, rel=1e-5)


def test_masked_tokens_never_matter_even_with_garbage():
    lp = _t([-1.0, 0.0]).requires_grad_()
    behav = _t([-1.0, -1e9])                           # padding garbage under mask 0
    prox = _t([-1.0, float("inf")])
    mask = torch.tensor([True, False])
    for decoupled in (False, True):
        loss, stats = ppo_loss(lp, prox, behav, _t([1.0, 1e6]), mask, 0.2, decoupled, 5.0)
        assert loss.item() == pytest.approx(-1.0)
        assert all(math.isfinite(v) for v in stats.values())


def test_no_masked_tokens_gives_zero_loss_not_nan():
    lp = torch.zeros(3, requires_grad=True)
    loss, stats = ppo_loss(lp, lp.detach(), lp.detach(), torch.ones(3), torch.zeros(3), 0.2, True, 5.0)
    assert loss.item() == 0.0 and stats["tokens"] == 0
    loss.backward()
    assert torch.all(lp.grad == 0)


def test_decoupled_without_proximal_is_an_error():
    with pytest.raises(ValueError, match="proximal"):
        ppo_loss(torch.zeros(2), None, torch.zeros(2), torch.ones(2), torch.ones(2), 0.2, True, 5.0)
