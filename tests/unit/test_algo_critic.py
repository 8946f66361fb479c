"""compute_gae, value_loss and explained_variance against the peer's definitions, on random cases.

The reference here is verl's (verl/trainer/ppo/core_algos.py, compute_gae_advantage_return and
compute_value_loss; verl/utils/torch_functional.py, masked_whiten with the unbiased variance),
written out as plain Python loops over one row at a time, so that it shares no code with
orchestrator.algo.critic's batched recursion."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from orchestrator.algo.critic import compute_gae, explained_variance, value_loss


def ref_gae(rewards, values, mask, gamma, lam):
    """Row by row, token by token: TD errors only on masked tokens, carried across the rest."""
    adv = []
    for r, v, m in zip(rewards, values, mask):
        row, nextv, last = [0.0] * len(r), 0.0, 0.0
        for t in reversed(range(len(r))):
            delta = r[t] + gamma * nextv - v[t]
            new = delta + gamma * lam * last
            if m[t]:
                nextv, last = v[t], new
            row[t] = last
        adv.append(row)
    returns = [[a + v for a, v in zip(ar, vr)] for ar, vr in zip(adv, values)]
    flat = [a for ar, mr in zip(adv, mask) for a, m in zip(ar, mr) if m]
    mean = sum(flat) / len(flat)
    var = sum((a - mean) ** 2 for a in flat) / (len(flat) - 1)
    white = [[(a - mean) / math.sqrt(var + 1e-8) for a in ar] for ar in adv]
    return white, returns


@st.composite
def cases(draw):
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    f = st.floats(-3, 3, allow_nan=False, width=32)
    rewards = [[draw(f) for _ in range(T)] for _ in range(B)]
    values = [[draw(f) for _ in range(T)] for _ in range(B)]
    mask = [[draw(st.booleans()) for _ in range(T)] for _ in range(B)]
    gamma, lam = draw(st.floats(0.5, 1.0)), draw(st.floats(0.0, 1.0))
    return rewards, values, mask, gamma, lam


@settings(max_examples=200, deadline=None)
@given(cases())
def test_gae_agrees_with_verls_definition(case):
    rewards, values, mask, gamma, lam = case
    t = lambda x: torch.tensor(x, dtype=torch.float64)             # noqa: E731
    adv, ret = compute_gae(t(rewards), t(values), t(mask), gamma, lam)
    n = sum(map(sum, mask))
    if n < 2:
        assert torch.all(adv == 0)
        return
    want_adv, want_ret = ref_gae(rewards, values, mask, gamma, lam)
    m = t(mask).bool()
    assert torch.allclose(adv[m], t(want_adv)[m], atol=1e-9, rtol=1e-7)
    assert torch.allclose(ret[m], t(want_ret)[m], atol=1e-9)
    assert torch.all(adv[~m] == 0) and torch.all(ret[~m] == 0)


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    v = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.3, 0.3]])
    _, ret = compute_gae(r, v, torch.ones(2, 3), 1.0, 1.0)
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))


def test_a_reward_after_a_tool_reply_reaches_the_turn_before_it():
    """Tokens 2-3 are a tool reply (mask 0): the turn-2 reward at token 5 and the value there are
    seen from token 1 as if the reply were absent."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1]])
    r = torch.tensor([[0, 0, 9, 9, 0, 1.0]])            # rewards on masked-out tokens are ignored
    v = torch.tensor([[0.1, 0.2, 7.0, 7.0, 0.3, 0.4]])
    _, ret = compute_gae(r, v, mask, 0.9, 0.8)
    _, want = compute_gae(torch.tensor([[0, 0, 0, 1.0]]), torch.tensor([[0.1, 0.2, 0.3, 0.4]]),
                          torch.ones(1, 4), 0.9, 0.8)
    assert torch.allclose(ret[mask.bool()], want[0])


def ref_value_loss(vp, ret, old, mask, clip):
    errs, fracs = [], []
    for a, R, o, m in zip(vp, ret, old, mask):
        if not m:
            continue
        vc = min(max(a, o - clip), o + clip)
        e1, e2 = (a - R) ** 2, (vc - R) ** 2
        errs.append(max(e1, e2))
        fracs.append(1.0 if e2 > e1 else 0.0)
    return 0.5 * sum(errs) / len(errs), sum(fracs) / len(fracs)


@settings(max_examples=200, deadline=None)
@example(([2.6000465756467854e-19], [0.00390625], [1.0], [True], 1.0))   # v - old rounds to -clip
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    *(st.lists(st.floats(-3, 3, width=32), min_size=n, max_size=n) for _ in range(3)),
    st.lists(st.booleans(), min_size=n, max_size=n).filter(any), st.floats(0.01, 1.0))))
def test_value_loss_agrees_with_verls_definition_token_mean(case):
    vp, ret, old, mask, clip = case
    t = lambda x: torch.tensor([x], dtype=torch.float64)            # noqa: E731
    loss, frac = value_loss(t(vp), t(ret), t(old), t(mask), clip, "token-mean")
    want_loss, want_frac = ref_value_loss(vp, ret, old, mask, clip)
    assert float(loss) == pytest.approx(want_loss, rel=1e-9, abs=1e-12)
    assert float(frac) == pytest.approx(want_frac)


def test_value_loss_gradient_is_cut_where_the_clipped_error_is_larger():
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[1.0, 1.0]])
    # token 1 moved toward R past the clip (0.5 > 0 + 0.2): the clipped error is larger, flat in v;
    # token 2 moved away from R: its own error is the larger and trains
    vp = torch.tensor([[0.5, -0.5]], requires_grad=True)
    loss, frac = value_loss(vp, ret, old, torch.ones(1, 2), 0.2, "token-mean")
    loss.backward()
    assert float(frac) == 0.5
    assert vp.grad[0, 0] == 0 and vp.grad[0, 1] != 0
    loss_seq, _ = value_loss(vp, ret, old, torch.ones(1, 2), None, "seq-mean-token-sum")
    assert float(loss_seq.detach()) == pytest.approx(0.5 * (0.25 + 2.25))


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    m = torch.ones(1, 4)
    assert explained_variance(ret.clone(), ret, m) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 2.5), ret, m) == pytest.approx(0.0)
    assert math.isnan(explained_variance(ret, torch.ones(1, 4), m))


def test_shapes_and_clip_range_are_checked():
    with pytest.raises(ValueError, match="values"):
        compute_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0)
    with pytest.raises(ValueError, match="clip_range"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 0.0,
                   "token-mean")
