"""A critic's math: generalized advantage estimation, the clipped value loss, explained variance.

Contract (torch tensors [B, T], one row per trajectory; `mask` 1 on the tokens the policy sampled,
0 on prompt, padding and, inside a multi-turn row, tool output or environment replies):
- `compute_gae(token_rewards, values, mask, gamma, lam) -> (advantages, returns)`: GAE
  (Schulman et al. 2016) backwards over each row. Only masked tokens are steps of the decision
  process: at a token with mask 0 the TD error is not taken and the next value and the running
  advantage carry across it unchanged, so a reward or value after a tool reply reaches the model
  turn before it as if the reply were not there (verl's `compute_gae_advantage_return` does the
  same). `returns = advantages + values` before whitening (the value target); `advantages` are
  then whitened over the mask: minus their masked mean, divided by sqrt(unbiased masked variance +
  1e-8), as verl's `masked_whiten`. Positions with mask 0 are 0 in both outputs. With one masked
  token the advantage is 0 (no variance to scale by); with none, all zeros. No gradient flows.
- `value_loss(vpreds, returns, old_values, mask, clip_range, agg_mode, horizon=None) ->
  (loss, clip_fraction)`: PPO's clipped value loss, 0.5 x agg(max((v - R)^2, (v_clip - R)^2))
  with v_clip = clamp(v, old - clip_range, old + clip_range) (verl's clip_by_value), aggregated
  over `mask` by `agg_loss`'s modes; `clip_fraction` is the masked share of tokens where the
  clipped error is the larger (the gradient is cut there). `clip_range=None`: unclipped, fraction 0.
- `explained_variance(values, returns, mask) -> float`: 1 - Var(R - V) / Var(R) over the mask
  (1: the critic explains the returns, 0: no better than their mean; nan when Var(R) is 0).
"""
from __future__ import annotations

from typing import Optional

import torch

from orchestrator.algo.aggregate import agg_loss, masked_sum
from orchestrator.algo.loss import masked_mean

WHITEN_EPS = 1e-8


def _check(name: str, t: torch.Tensor, like: torch.Tensor) -> None:
    if t.shape != like.shape or t.dim() != 2:
        raise ValueError(f"{name} {tuple(t.shape)}: expected [B, T] like {tuple(like.shape)}")


def _masked_moments(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Mean and unbiased variance of x over mask (bool), and the count."""
    n = int(mask.sum())
    mean = masked_mean(x, mask)
    return mean, masked_sum((x - mean) ** 2, mask) / max(n - 1, 1), n


@torch.no_grad()
def compute_gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages (whitened over `mask`) and returns; see the module docstring."""
    _check("values", values, token_rewards)
    _check("mask", mask, token_rewards)
    m = mask.to(values.dtype)
    r = token_rewards.to(values.dtype)
    B, T = values.shape
    next_value = values.new_zeros(B)
    running = values.new_zeros(B)
    raw = torch.zeros_like(values)
    for t in range(T - 1, -1, -1):
        step = r[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        on = m[:, t]
        running = on * step + (1 - on) * running            # carried across unmasked tokens
        next_value = on * values[:, t] + (1 - on) * next_value
        raw[:, t] = running
    returns = (raw + values) * m
    mean, var, n = _masked_moments(raw, mask.bool())
    if n < 2:
        return torch.zeros_like(raw), returns
    return (raw - mean) * torch.rsqrt(var + WHITEN_EPS) * m, returns


def value_loss(vpreds: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
               mask: torch.Tensor, clip_range: Optional[float], agg_mode: str,
               horizon: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped value loss and its clip fraction; see the module docstring."""
    for name, t in (("returns", returns), ("old_values", old_values), ("mask", mask)):
        _check(name, t, vpreds)
    if clip_range is not None and not clip_range > 0:
        raise ValueError(f"clip_range must be > 0 or None, got {clip_range}")
    keep = mask.bool()
    err = (vpreds - returns) ** 2
    if clip_range is None:
        worst, clipped = err, torch.zeros_like(err, dtype=torch.bool)
    else:
        v_clip = torch.clamp(vpreds, old_values - clip_range, old_values + clip_range)
        err_clip = (v_clip - returns) ** 2
        worst, clipped = torch.maximum(err, err_clip), err_clip > err
    loss = 0.5 * agg_loss(worst, keep, agg_mode, horizon)
    return loss, masked_mean(clipped.to(vpreds.dtype), keep).detach()


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over `mask`."""
    _check("returns", returns, values)
    keep = mask.bool()
    _, var_r, n = _masked_moments(returns, keep)
    if n < 2 or float(var_r) == 0.0:
        return float("nan")
    _, var_e, _ = _masked_moments(returns - values, keep)
    return float(1.0 - var_e / var_r)
