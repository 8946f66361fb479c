"""Training recipes: advantage estimators, loss aggregation, policy losses, KL penalties and
rollout corrections, as pure functions behind name -> function registries (callers pass the
configured name; none of them special-cases one).

Modules:
- advantages: `compute_advantages(rewards, group_index, estimator, norm_by_std=True, eps=1e-6,
  lengths=None)`: grpo, grpo_population_std, dr_grpo, rloo, reinforce_pp_baseline (numpy only:
  the train sink runs in the supervisor, which never imports torch).
- aggregate: `agg_loss(loss_mat, loss_mask, mode, horizon=None)` with verl's modes, and
  `agg_units` for exact split (micro-batch, rank) invariance.
- policy: `policy_loss(name, logprobs, old_logprobs, advantages, loss_mask, *, clip_low,
  clip_high, clip_c=None, agg="token-mean", horizon=None, weights=None) -> (loss, stats)`: ppo
  (asymmetric and dual clip), gspo, cispo.
- kl: `kl_penalty(logprobs, ref_logprobs, estimator)`: k1, k2, k3.
- overlong: DAPO's overlong handling, `overlong_penalty(lengths, max_len, buffer_len, factor)`
  (the soft punishment added to rewards) and `cut_at_limit(...)` (the completions to filter);
  numpy only.
- correction: `rollout_correction(...)`: TIS / MIS weights at token, sequence or geometric level.
- pass_at_k: `pass_at_k(n, c, k)`, the unbiased pass@k estimator (Chen et al. 2021), numerically
  stable for large n; numpy only (the eval sink reports it).
- critic: `compute_gae(token_rewards, values, mask, gamma, lam) -> (advantages, returns)` (GAE,
  carried across unmasked tokens, advantages whitened over the mask),
  `value_loss(vpreds, returns, old_values, mask, clip_range, agg_mode) -> (loss, clip_fraction)`
  (PPO's clipped value loss) and `explained_variance(values, returns, mask)`.
- registry: `registrar(table, what)`, the one name -> function registry the modules above share.
- loss: AReaL's decoupled PPO objective and the standard clip (`ppo_loss`, `masked_mean`), the
  trainer's loss before these recipes.
- schedule: `lr_at(step, *, lr, total_steps, schedule, min_ratio, warmup_steps)`, the learning
  rate of a trainer step (warm-up, then constant or cosine).
- stamp: the per-token policy versions of a trajectory (run-length encoded) and their head age.

May import torch and numpy only; nothing of the runtime, the loop or the run directory. The torch
modules load on first use of their names, so `from orchestrator.algo import compute_advantages`
(or the overlong functions, or pass_at_k) imports numpy only.
"""
from __future__ import annotations

import importlib

from orchestrator.algo.advantages import ESTIMATORS, compute_advantages
from orchestrator.algo.overlong import cut_at_limit, overlong_penalty
from orchestrator.algo.pass_at_k import pass_at_k

_LAZY = {"agg_loss": "aggregate", "agg_units": "aggregate", "AGG_MODES": "aggregate",
         "policy_loss": "policy", "POLICY_LOSSES": "policy",
         "kl_penalty": "kl", "KL_ESTIMATORS": "kl",
         "rollout_correction": "correction", "CORRECTIONS": "correction",
         "CORRECTION_LEVELS": "correction",
         "compute_gae": "critic", "value_loss": "critic", "explained_variance": "critic"}

__all__ = ["compute_advantages", "ESTIMATORS", "cut_at_limit", "overlong_penalty", "pass_at_k",
           *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator.algo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"orchestrator.algo.{module}"), name)
