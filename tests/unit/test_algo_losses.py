"""orchestrator.algo agg_loss and policy_loss: every aggregation mode and loss against hand-computed
values, gradients where the definition is about the gradient (gspo's token-level gradient, cispo's
stop-gradient), fully masked sequences, ratios far from 1, split invariance via agg_units, and the
decoupled objective of orchestrator.algo.loss reproduced exactly."""
import math

import pytest
import torch

from orchestrator.algo import AGG_MODES, POLICY_LOSSES, agg_loss, agg_units, policy_loss
from orchestrator.algo.correction import rollout_correction
from orchestrator.algo.loss import ppo_loss


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# three sequences: 2 masked tokens, 1 masked token, none (fully masked: it must count nowhere)
LOSS = _t([[1.0, 3.0, 100.0], [4.0, 50.0, 60.0], [7.0, 8.0, 9.0]])
MASK = _t([[1, 1, 0], [1, 0, 0], [0, 0, 0]], torch.bool)


@pytest.mark.parametrize("mode,want", [
    ("token-mean", (1 + 3 + 4) / 3),
    ("seq-mean-token-mean", ((1 + 3) / 2 + 4 / 1) / 2),
    ("seq-mean-token-sum", ((1 + 3) + 4) / 2),
    ("seq-mean-token-sum-norm", ((1 + 3) + 4) / 2 / 8),
])
def test_each_mode_by_hand(mode, want):
    assert agg_loss(LOSS, MASK, mode, horizon=8).item() == pytest.approx(want)


@pytest.mark.parametrize("mode", list(AGG_MODES))
def test_nothing_masked_is_zero_and_padding_never_leaks(mode):
    mat = _t([[float("nan"), float("inf")]]).requires_grad_()
    loss = agg_loss(mat, torch.zeros(1, 2, dtype=torch.bool), mode, horizon=4)
    assert loss.item() == 0.0
    loss.backward()
    assert mat.grad.tolist() == [[0.0, 0.0]]
    # a nan / inf on an unmasked position changes nothing
    poisoned = LOSS.clone()
    poisoned[0, 2], poisoned[2, 0] = float("nan"), float("inf")
    assert agg_loss(poisoned, MASK, mode, horizon=8).item() == agg_loss(LOSS, MASK, mode, horizon=8).item()


@pytest.mark.parametrize("mode", list(AGG_MODES))
def test_parts_weighted_by_units_sum_to_the_whole(mode):
    torch.manual_seed(0)
    mat = torch.randn(6, 5)
    mask = torch.rand(6, 5) > 0.4
    mask[3] = False                                    # one sequence with no masked token
    whole = agg_loss(mat, mask, mode, horizon=5)
    units = agg_units(mask, mode)
    split = sum(agg_loss(mat[a:b], mask[a:b], mode, horizon=5) * agg_units(mask[a:b], mode) / units
                for a, b in [(0, 1), (1, 4), (4, 6)])
    assert split.item() == pytest.approx(whole.item(), rel=1e-6)
    assert agg_units(MASK, mode) == (3 if mode == "token-mean" else 2)


def test_bad_mode_and_missing_horizon_are_named():
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'seq-mean'"):
        agg_loss(LOSS, MASK, "seq-mean")
    with pytest.raises(ValueError, match="horizon"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="shape"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")


# ---------------------------------------------------------------- ppo
def test_ppo_asymmetric_clip_by_hand():
    # ratios 1.5 and 0.5 for A = +1, and 1.5, 0.5 for A = -1; bounds [1 - 0.2, 1 + 0.28]
    lp = torch.log(_t([[1.5, 0.5, 1.5, 0.5]])).requires_grad_()
    old = torch.zeros(1, 4)
    adv = _t([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, stats = policy_loss("ppo", lp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # per token: max(-r A, -clip(r) A): -1.28 (clipped), -0.5, 1.5, 0.8 (clipped)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 1.5 + 0.8) / 4)
    assert stats["clip_frac"] == 0.5 and stats["tokens"] == 4
    loss.backward()
    # clipped tokens have no gradient; unclipped ones d(-A r)/dlp = -A r, over 4 tokens
    assert lp.grad[0].tolist() == pytest.approx([0.0, -0.5 / 4, 1.5 / 4, 0.0])


def test_dual_clip_bounds_negative_advantages_far_from_one():
    lp = _t([[5.0, 5.0, 30.0]]).requires_grad_()     # ratios e^5, e^5 and e^30 (clamped to e^20)
    old = torch.zeros(1, 3)
    adv = _t([[-2.0, 1.0, -1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = policy_loss("ppo", lp, old, adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    # A=-2: min(2 e^5, 2 * 3) = 6; A=+1: -1.2 (upper clip); A=-1: min(e^20, 3) = 3
    assert loss.item() == pytest.approx((6.0 - 1.2 + 3.0) / 3)
    assert stats["dual_clip_frac"] == pytest.approx(2 / 3)
    loss.backward()
    assert lp.grad.tolist() == [[0.0, 0.0, 0.0]]        # every token held by a constant: no nan
    plain, _ = policy_loss("ppo", lp.detach(), old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert plain.item() == pytest.approx((2 * math.exp(5) - 1.2 + math.exp(20)) / 3, rel=1e-5)


def test_weights_multiply_tokens_and_keep_the_denominator():
    lp = torch.zeros(1, 3)
    adv = _t([1.0])                                     # per sequence, broadcast
    mask = torch.ones(1, 3, dtype=torch.bool)
    w = _t([[2.0, 0.0, 0.5]])
    loss, _ = policy_loss("ppo", lp, lp, adv, mask, clip_low=0.2, clip_high=0.2, weights=w)
    assert loss.item() == pytest.approx(-(2.0 + 0.0 + 0.5) / 3)


@pytest.mark.parametrize("agg", list(AGG_MODES))
def test_policy_loss_aggregates_by_agg(agg):
    lp = torch.zeros(3, 3)
    adv = _t([1.0, 2.0, 3.0])
    loss, _ = policy_loss("ppo", lp, lp, adv, MASK, clip_low=0.2, clip_high=0.2, agg=agg, horizon=8)
    per_token = (-adv).unsqueeze(-1).expand(3, 3)       # on-policy: -A on every token
    assert loss.item() == pytest.approx(agg_loss(per_token, MASK, agg, horizon=8).item())
    assert loss.item() == pytest.approx({"token-mean": -(1 + 1 + 2) / 3, "seq-mean-token-mean": -1.5,
                                         "seq-mean-token-sum": -2.0,
                                         "seq-mean-token-sum-norm": -2.0 / 8}[agg])


def test_decoupled_objective_is_ppo_with_the_mis_token_weight_exactly():
    """The default job's loss: policy_loss + rollout_correction reproduce algo.loss.ppo_loss bit
    for bit (value and gradient), the behaviour cap included."""
    torch.manual_seed(1)
    shape = (4, 7)
    behav = -torch.rand(shape) * 3
    prox = behav + torch.randn(shape) * 1.0               # some behaviour weights above the cap 5
    lp0 = prox + torch.randn(shape) * 0.3
    adv = torch.randn(4, 1).expand(shape).contiguous()
    mask = torch.rand(shape) > 0.3
    mask[2] = False
    a = lp0.clone().requires_grad_()
    want, want_stats = ppo_loss(a, prox, behav, adv, mask, 0.2, True, 5.0)
    want.backward()
    b = lp0.clone().requires_grad_()
    w, capped, cstats = rollout_correction(prox, behav, mask, "mis", "token", threshold=5.0)
    got, stats = policy_loss("ppo", b, prox, adv, mask, clip_low=0.2, clip_high=0.2, weights=w)
    got.backward()
    assert bool(capped.any())
    assert got.item() == want.item()
    assert torch.equal(a.grad, b.grad)
    assert stats["clip_frac"] == want_stats["clip_frac"]
    assert cstats["weight_mean"] == pytest.approx(want_stats["imp_weight_mean"])
    assert cstats["hit_frac"] == pytest.approx(want_stats["behav_capped_frac"])


# ---------------------------------------------------------------- gspo
def test_gspo_ratio_is_the_sequence_geometric_mean_with_a_token_level_gradient():
    # sequence 0: log-ratios 0.1, 0.3 (masked), pad; sequence 1: log-ratio -0.6
    old = torch.zeros(2, 3)
    lp = _t([[0.1, 0.3, 9.0], [-0.6, 0.0, 0.0]]).requires_grad_()
    mask = _t([[1, 1, 0], [1, 0, 0]], torch.bool)
    adv = _t([1.0, -1.0])
    loss, stats = policy_loss("gspo", lp, old, adv, mask, clip_low=0.5, clip_high=0.5,
                              agg="seq-mean-token-mean")
    s0, s1 = math.exp(0.2), math.exp(-0.6)              # both inside [0.5, 1.5]: unclipped
    assert loss.item() == pytest.approx((-s0 + s1) / 2)
    assert stats["ratio_mean"] == pytest.approx((2 * s0 + s1) / 3)
    loss.backward()
    # d/dlp_t of -A s_t, s_t = sg(s) pi_t / sg(pi_t): -A s, then 1/|y| (token mean), 1/2 (seq mean)
    assert lp.grad.flatten().tolist() == pytest.approx([-s0 / 4, -s0 / 4, 0.0, s1 / 2, 0.0, 0.0])


def test_gspo_clips_the_whole_sequence():
    old = torch.zeros(1, 2)
    lp = _t([[0.5, 0.7]]).requires_grad_()               # s = e^0.6 = 1.82 > 1 + 4e-4
    loss, stats = policy_loss("gspo", lp, old, _t([1.0]), torch.ones(1, 2, dtype=torch.bool),
                              clip_low=3e-4, clip_high=4e-4)
    assert loss.item() == pytest.approx(-(1 + 4e-4))
    assert stats["clip_frac"] == 1.0
    loss.backward()
    assert lp.grad.tolist() == [[0.0, 0.0]]


# ---------------------------------------------------------------- cispo
def test_cispo_keeps_a_gradient_through_the_clip():
    # ratios e^1 (clipped to 1.28), 1.0, e^-2 (clipped to 0.8); A = 2, -1, 1
    old = _t([[-2.0, -1.0, -0.5]])
    lp = (old + _t([[1.0, 0.0, -2.0]])).requires_grad_()
    adv = _t([[2.0, -1.0, 1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = policy_loss("cispo", lp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    lpv = [-1.0, -1.0, -2.5]
    w = [1.28, 1.0, 0.8]
    assert loss.item() == pytest.approx(-(2 * w[0] * lpv[0] - w[1] * lpv[1] + w[2] * lpv[2]) / 3)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    loss.backward()
    # the weight is a constant: d/dlp = -A * clip(r), never 0 for a clipped token
    assert lp.grad.flatten().tolist() == pytest.approx([-2 * 1.28 / 3, 1.0 / 3, -0.8 / 3])


# ---------------------------------------------------------------- contract
@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_on_policy_every_loss_has_the_policy_gradient(name):
    lp = _t([[-1.0, -2.0, -0.5]]).requires_grad_()
    adv = _t([[1.0, -2.0, 3.0]])
    mask = _t([[1, 1, 0]], torch.bool)
    loss, stats = policy_loss(name, lp, lp.detach(), adv, mask, clip_low=0.2, clip_high=0.2)
    loss.backward()
    # -A per token over 2 tokens (gspo too: s = 1 and d s_t / d lp_t = s)
    assert lp.grad.flatten().tolist() == pytest.approx([-0.5, 1.0, 0.0])
    assert stats["clip_frac"] == 0.0 and stats["approx_kl"] == 0.0 and stats["tokens"] == 2


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_fully_masked_batch_is_zero_with_finite_gradients(name):
    lp = torch.full((2, 3), -50.0).requires_grad_()
    loss, stats = policy_loss(name, lp, torch.zeros(2, 3), _t([1.0, -1.0]),
                              torch.zeros(2, 3, dtype=torch.bool), clip_low=0.2, clip_high=0.2,
                              agg="seq-mean-token-mean")
    loss.backward()
    assert loss.item() == 0.0 and stats["tokens"] == 0 and stats["ratio_mean"] == 1.0
    assert torch.isfinite(lp.grad).all()


def test_bad_arguments_are_named():
    lp, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="unknown policy loss 'grpo'"):
        policy_loss("grpo", lp, lp, lp, mask, clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss("gspo", lp, lp, lp, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss("ppo", lp, lp, lp, mask, clip_low=0.2, clip_high=0.2, clip_c=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss("ppo", lp, lp, lp, mask, clip_low=0.0, clip_high=0.2)
