"""PPO policy losses on per-token tensors: the decoupled objective (AReaL) and the standard clip.

Contract: `ppo_loss(logprobs, proximal_logprobs, behaviour_logprobs, advantages, loss_mask, eps_clip,
use_decoupled, behav_imp_weight_cap)` -> `(loss, stats)`. All tensors share one shape (any shape,
typically [batch, seq]); `logprobs` carries the graph, the others are treated as constants.

- decoupled (use_decoupled=True): ratio = exp(logprobs - proximal); per-token loss
  max(-A * ratio, -A * clip(ratio, 1-eps, 1+eps)) times the behaviour importance weight
  w = exp(proximal - behaviour). Tokens whose w exceeds `behav_imp_weight_cap` (None: no cap) get
  weight 0, i.e. they are masked out of the numerator but still counted in the denominator, as AReaL.
- standard (use_decoupled=False): ratio = exp(logprobs - behaviour), same clip, no extra weight;
  `proximal_logprobs` is ignored (may be None).
- loss = sum over loss-masked tokens / number of loss-masked tokens (0 when there are none).
- stats (python floats): clip_frac (tokens where the clipped branch is active), ratio_mean,
  imp_weight_mean (mean w over masked tokens after capping; 1.0 when not decoupled),
  behav_capped_frac, approx_kl (mean of proximal/behaviour - logprobs), tokens.
"""
from __future__ import annotations

from typing import Optional

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    count = mask.sum()
    return torch.where(mask, x, torch.zeros_like(x)).sum() / count.clamp(min=1)


def ppo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: Optional[torch.Tensor],
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_clip: float,
    use_decoupled: bool,
    behav_imp_weight_cap: Optional[float],
) -> tuple[torch.Tensor, dict[str, float]]:
    mask = loss_mask.bool()
    logprobs = logprobs.float()
    behaviour = behaviour_logprobs.detach().float()
    adv = advantages.detach().float()
    if use_decoupled:
        if proximal_logprobs is None:
            raise ValueError("decoupled loss needs proximal_logprobs (actor.recompute_logprob)")
        anchor = proximal_logprobs.detach().float()
    else:
        anchor = behaviour
    # anchor is only used where mask is set; zero elsewhere keeps exp() finite on padding
    log_ratio = torch.where(mask, logprobs - anchor, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * clipped
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    clip_active = (loss_clipped > loss_unclipped) & mask

    if use_decoupled:
        behav_log = torch.where(mask, anchor - behaviour, torch.zeros_like(anchor))
        weight = torch.exp(behav_log)
        keep = mask
        if behav_imp_weight_cap is not None:
            keep = mask & (weight <= behav_imp_weight_cap)
        weight = torch.where(keep, weight, torch.zeros_like(weight))
        per_token = per_token * weight
        capped = mask & ~keep
    else:
        weight = mask.float()
        capped = torch.zeros_like(mask)

    loss = masked_mean(per_token, mask)
    with torch.no_grad():
        n = int(mask.sum())
        stats = {
            "loss": float(loss),
            "clip_frac": float(masked_mean(clip_active.float(), mask)),
            "ratio_mean": float(masked_mean(ratio, mask)) if n else 1.0,
            "imp_weight_mean": float(masked_mean(weight, mask)) if n else 1.0,
            "behav_capped_frac": float(masked_mean(capped.float(), mask)),
            "approx_kl": float(masked_mean(anchor - logprobs, mask)),
            "tokens": float(n),
        }
    return loss, stats
