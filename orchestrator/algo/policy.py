"""Policy-gradient losses on per-token log-probabilities, by name.

Contract: `policy_loss(name, logprobs, old_logprobs, advantages, loss_mask, *, clip_low, clip_high,
clip_c=None, agg="token-mean", horizon=None, weights=None) -> (loss, stats)`.
- `logprobs` [n, L] carries the graph (the policy being trained); `old_logprobs` [n, L] is the
  policy the ratio is taken against (the proximal / recomputed policy, or the behaviour policy),
  treated as a constant. Rows are sequences (the sequence-level losses and aggregations need it).
- `advantages`: [n, L] per token, or [n] per sequence (broadcast to its tokens); a constant.
- `loss_mask` [n, L]: the tokens that count; everything else may hold anything (padding).
- `weights` [n, L] (None: 1) multiply each token's loss, as constants: the rollout correction
  (orchestrator.algo.correction) or the decoupled objective's behaviour weight. A token of weight 0
  still counts in the aggregation's denominator.
- the per-token loss is aggregated by `agg_loss(., loss_mask, agg, horizon)`.
- `clip_low`, `clip_high`: the ratio is clipped to [1 - clip_low, 1 + clip_high] (DAPO's
  clip-higher: clip_high > clip_low). `clip_c` (> 1, ppo only): dual clip.
- log-ratios are clamped to [-20, 20] before exp (as verl): a ratio of e^20 is already far outside
  any clip, and the clamp keeps exp finite so an unselected branch never turns a gradient to nan.

Losses (`POLICY_LOSSES`; unknown names raise ValueError naming the known ones), r = exp(logprobs -
old_logprobs) per token, A the advantage:
- `ppo`: max(-A r, -A clip(r)) (PPO, Schulman et al. 2017, with asymmetric bounds); with `clip_c`,
  tokens with A < 0 take min(that, -A clip_c) (dual-clip PPO, Ye et al. 2020).
- `gspo`: the sequence ratio s = exp(mean over the sequence's masked tokens of log r), in GSPO's
  token form s_t = sg(s) * pi(y_t) / sg(pi(y_t)): its value is s on every token, its gradient is
  s * grad log pi(y_t); then PPO's clip on s_t (GSPO, Zheng et al. 2025; use small clip ranges,
  e.g. 3e-4 / 4e-4, and `seq-mean-token-mean`).
- `cispo`: -sg(clip(r)) * A * logprobs: the clipped importance weight as a constant, so every
  token keeps a gradient, none is dropped by the clip (CISPO, MiniMax-M1 2025).

stats (python floats, over masked tokens): loss, clip_frac (tokens where the clip is active: ppo and
gspo the clipped branch chosen, cispo r outside the bounds), dual_clip_frac (ppo with clip_c: tokens
held by -A clip_c), ratio_mean, approx_kl (mean old_logprobs - logprobs), tokens.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from orchestrator.algo.aggregate import agg_loss, masked_sum
from orchestrator.algo.registry import registrar

LOG_RATIO_CLAMP = 20.0

# fn(logprobs, old, adv, mask, clip_low, clip_high, clip_c) -> (per-token loss, ratio, clipped, dual)
LossFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
POLICY_LOSSES: dict[str, LossFn] = {}


register_policy_loss = registrar(POLICY_LOSSES, "policy loss")


def _clip(ratio, adv, lo, hi):
    """PPO's pessimistic clipped surrogate per token, and where the clipped branch is chosen."""
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - lo, 1.0 + hi)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@register_policy_loss("ppo")
def _ppo(lp, old, adv, mask, lo, hi, clip_c):
    ratio = torch.exp(torch.where(mask, lp - old, torch.zeros_like(lp)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    per_token, clipped = _clip(ratio, adv, lo, hi)
    dual = torch.zeros_like(mask)
    if clip_c is not None:
        bound = -adv * clip_c
        dual = (adv < 0) & (per_token > bound)
        per_token = torch.where(adv < 0, torch.minimum(per_token, bound), per_token)
    return per_token, ratio, clipped, dual


@register_policy_loss("gspo")
def _gspo(lp, old, adv, mask, lo, hi, clip_c):
    log_r = torch.where(mask, lp - old, torch.zeros_like(lp))
    seq = masked_sum(log_r, mask, -1) / mask.sum(-1).clamp(min=1)
    log_s = (lp - lp.detach() + seq.detach().unsqueeze(-1)).clamp(max=LOG_RATIO_CLAMP)
    log_s = torch.where(mask, log_s, torch.zeros_like(log_s))
    ratio = torch.exp(log_s)
    per_token, clipped = _clip(ratio, adv, lo, hi)
    return per_token, ratio, clipped, torch.zeros_like(mask)


@register_policy_loss("cispo")
def _cispo(lp, old, adv, mask, lo, hi, clip_c):
    ratio = torch.exp(torch.where(mask, lp - old, torch.zeros_like(lp)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = torch.clamp(ratio, 1.0 - lo, 1.0 + hi).detach()
    per_token = -adv * weight * torch.where(mask, lp, torch.zeros_like(lp))
    clipped = (ratio < 1.0 - lo) | (ratio > 1.0 + hi)
    return per_token, ratio, clipped, torch.zeros_like(mask)


def _per_token(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    t = t.detach().float()
    if like.dim() == 2 and t.dim() == 1:
        t = t.unsqueeze(-1)
    return t.expand_as(like)


def policy_loss(name: str, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                advantages: torch.Tensor, loss_mask: torch.Tensor, *, clip_low: float,
                clip_high: float, clip_c: Optional[float] = None, agg: str = "token-mean",
                horizon: Optional[float] = None,
                weights: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The aggregated loss `name` and its stats (see the module docstring)."""
    fn = POLICY_LOSSES.get(name)
    if fn is None:
        raise ValueError(f"unknown policy loss {name!r} (known: {', '.join(POLICY_LOSSES)})")
    if not (clip_low > 0 and clip_high > 0):
        raise ValueError(f"clip_low and clip_high must be > 0 (got {clip_low}, {clip_high})")
    if clip_c is not None and (name != "ppo" or not clip_c > 1):
        raise ValueError(f"clip_c (dual clip) needs the ppo loss and a value > 1 (got {name}, {clip_c})")
    mask = loss_mask.bool()
    lp = logprobs.float()
    old = old_logprobs.detach().float()
    adv = _per_token(advantages, lp)
    per_token, ratio, clipped, dual = fn(lp, old, adv, mask, float(clip_low), float(clip_high), clip_c)
    if weights is not None:
        per_token = per_token * weights.detach().float()
    loss = agg_loss(per_token, mask, agg, horizon)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = {
            "loss": float(loss),
            "clip_frac": float(masked_sum((clipped & mask).float(), mask) / n),
            "dual_clip_frac": float(masked_sum((dual & mask).float(), mask) / n),
            "ratio_mean": float(masked_sum(ratio, mask) / n) if bool(mask.any()) else 1.0,
            "approx_kl": float(masked_sum(old - lp, mask) / n),
            "tokens": float(mask.sum()),
        }
    return loss, stats
