"""Train/inference mismatch correction: importance weights of the trainer's recomputed policy over
the inference engine's behaviour policy, truncated (TIS) or masked (MIS).

Contract: `rollout_correction(logprobs, behaviour_logprobs, loss_mask, mode, level, *, threshold,
threshold_low=None) -> (weights, hit, stats)`, all without gradient.
- `logprobs` [n, L]: the trainer's recomputed logprobs; `behaviour_logprobs` [n, L]: the engine's
  (what the tokens were sampled with); rows are sequences; `loss_mask` [n, L] the tokens that count.
- per-token log w_t = logprobs - behaviour_logprobs on masked tokens; the `level`
  (`CORRECTION_LEVELS`) sets what w is compared with the thresholds and multiplied in:
  `token`: w_t; `sequence`: the product of the sequence's token ratios, exp(sum log w_t);
  `geometric`: their length-normalised geometric mean, exp(mean log w_t). A sequence-level w is
  the same for every token of its sequence.
- `mode` (`CORRECTIONS`):
  `tis` (truncated IS): weight = min(w, threshold); `hit` marks the tokens truncated (w > threshold).
  `mis` (masked IS): weight = w where threshold_low <= w <= threshold, else 0 (the token, or at a
  sequence level the whole sequence, is dropped); `hit` marks the dropped tokens. threshold_low
  defaults to 0 (verl, TRL and AReaL's behaviour cap drop only above); give 1/threshold for the
  two-sided mask.
  A dropped token keeps its place in the loss's denominator (weight 0, as TRL's masks and AReaL's
  cap), so the loss scale does not depend on how much is dropped and a batch split into parts sums
  to the same loss.
- `weights` [n, L] float32 (0 off the mask), `hit` [n, L] bool (False off the mask).
- stats (python floats, over masked tokens): weight_mean (of the final weights), hit_frac, tokens.
  Unknown mode or level names, or thresholds out of order, raise ValueError naming them.

AReaL's decoupled objective weights tokens by exactly `mis` at `token` level with [0, cap]
(`actor.behav_imp_weight_cap`) against the proximal policy.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from orchestrator.algo.aggregate import masked_sum

CORRECTION_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": lambda log_w, mask: log_w,
    "sequence": lambda log_w, mask: masked_sum(log_w, mask, -1).unsqueeze(-1).expand_as(log_w),
    "geometric": lambda log_w, mask: (masked_sum(log_w, mask, -1) / mask.sum(-1).clamp(min=1))
    .unsqueeze(-1).expand_as(log_w),
}


def _tis(w, lo, hi):
    return torch.clamp(w, max=hi), w > hi


def _mis(w, lo, hi):
    keep = (w >= lo) & (w <= hi)
    return torch.where(keep, w, torch.zeros_like(w)), ~keep


CORRECTIONS: dict[str, Callable] = {"tis": _tis, "mis": _mis}


@torch.no_grad()
def rollout_correction(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                       loss_mask: torch.Tensor, mode: str, level: str, *, threshold: float,
                       threshold_low: Optional[float] = None
                       ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Per-token correction weights, the tokens truncated or dropped, and stats (module docstring)."""
    if mode not in CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r} (known: {', '.join(CORRECTIONS)})")
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"unknown rollout correction level {level!r} "
                         f"(known: {', '.join(CORRECTION_LEVELS)})")
    lo = 0.0 if threshold_low is None else float(threshold_low)
    if mode == "tis" and threshold_low is not None:
        raise ValueError("tis truncates from above only: threshold_low is for mis")
    if not (threshold > 0 and 0 <= lo <= threshold):
        raise ValueError(f"rollout correction thresholds must satisfy 0 <= threshold_low <= "
                         f"threshold, threshold > 0 (got {lo}, {threshold})")
    mask = loss_mask.bool()
    diff = logprobs.float() - behaviour_logprobs.float()
    log_w = torch.where(mask, diff, torch.zeros_like(diff))
    w = torch.exp(CORRECTION_LEVELS[level](log_w, mask))
    weights, hit = CORRECTIONS[mode](w, lo, float(threshold))
    weights = torch.where(mask, weights, torch.zeros_like(weights))
    hit = hit & mask
    n = mask.sum().clamp(min=1)
    stats = {"weight_mean": float(masked_sum(weights, mask) / n) if bool(mask.any()) else 1.0,
             "hit_frac": float(hit.sum() / n), "tokens": float(mask.sum())}
    return weights, hit, stats
