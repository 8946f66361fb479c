"""Outcome-reward advantage estimators (one scalar reward per sample), numpy only.

Contract: `compute_advantages(rewards, group_index, estimator, norm_by_std=True, eps=1e-6,
lengths=None) -> np.ndarray` float64[N], one advantage per sample, broadcast by the trainer to the
sample's loss-masked tokens. Samples of one prompt share a `group_index` (any integers; groups need
not be contiguous). `lengths` (int[N]) are the loss-masked tokens of each sample: a sample with
length 0 (nothing to train) takes part in no baseline and gets 0; `reinforce_pp_baseline` needs
them. Unknown estimator names raise ValueError naming the known ones (`ESTIMATORS`).

Estimators (verl's names and meanings; r = reward, G = the sample's group, n = |G|):
- `grpo`: r - mean_G, divided by (std_G + eps) when `norm_by_std`, with the unbiased std (ddof 1)
  as verl and TRL compute it (the GRPO paper; `norm_by_std=False` is Dr. GRPO's advantage).
- `grpo_population_std`: as `grpo` with the population std (ddof 0): this project's original
  advantage, the default job's, kept so its numbers do not change.
- `dr_grpo`: r - mean_G, never divided (Dr. GRPO, Liu et al. 2025); `norm_by_std` is not read.
- `rloo`: r minus the mean of the other n - 1 samples of G, = n / (n - 1) (r - mean_G) (RLOO,
  Ahmadian et al. 2024); `norm_by_std` is not read.
- `reinforce_pp_baseline`: r - mean_G, then whitened over the batch's loss-masked tokens: each
  sample counts `lengths[i]` times in the mean and in the unbiased std, a = (a - mean) / (std + eps)
  (REINFORCE++-baseline, Hu et al. 2025, as verl's masked whitening); `norm_by_std` is not read.

Singleton groups (n = 1, counting only samples with tokens) and all-equal groups get 0 from every
group baseline: no other sample tells how good the one reward is (verl would pass the raw reward;
a caller that wants a batch baseline for single samples gives them one group_index). Under
`reinforce_pp_baseline` that 0 is then whitened with the rest of the batch.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from orchestrator.algo.registry import registrar

# fn(rewards f64[M], groups int[M] in 0..K-1, norm_by_std, eps, lengths int[M]) -> f64[M], over the
# samples with tokens only
Estimator = Callable[[np.ndarray, np.ndarray, bool, float, np.ndarray], np.ndarray]
ESTIMATORS: dict[str, Estimator] = {}


register_estimator = registrar(ESTIMATORS, "advantage estimator")


def _group_stats(r: np.ndarray, g: np.ndarray, ddof: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample group size, group mean and group std (0 where the group has <= ddof samples),
    with numpy's own mean and std of each group's rewards."""
    n, mean, std = (np.zeros(r.shape, dtype=np.float64) for _ in range(3))
    order = np.argsort(g, kind="stable")
    for idx in np.split(order, np.flatnonzero(np.diff(g[order])) + 1):
        if idx.size:
            x = r[idx]
            n[idx], mean[idx] = idx.size, x.mean()
            std[idx] = x.std(ddof=ddof) if idx.size > ddof else 0.0
    return n, mean, std


def _grpo(r, g, norm_by_std, eps, ddof):
    n, mean, std = _group_stats(r, g, ddof)
    centred = np.where(n > 1, r - mean, 0.0)
    return centred / (std + eps) if norm_by_std else centred


@register_estimator("grpo")
def _grpo_unbiased(r, g, norm_by_std, eps, lengths):
    return _grpo(r, g, norm_by_std, eps, ddof=1)


@register_estimator("grpo_population_std")
def _grpo_population(r, g, norm_by_std, eps, lengths):
    return _grpo(r, g, norm_by_std, eps, ddof=0)


@register_estimator("dr_grpo")
def _dr_grpo(r, g, norm_by_std, eps, lengths):
    return _grpo(r, g, False, eps, ddof=1)


@register_estimator("rloo")
def _rloo(r, g, norm_by_std, eps, lengths):
    n, mean, _ = _group_stats(r, g, 1)
    return np.where(n > 1, (r - mean) * n / np.maximum(n - 1, 1), 0.0)


@register_estimator("reinforce_pp_baseline")
def _reinforce_pp_baseline(r, g, norm_by_std, eps, lengths):
    a = _grpo(r, g, False, eps, ddof=1)
    w = lengths.astype(np.float64)
    total = w.sum()
    mean = float((w * a).sum() / total)
    var = float((w * (a - mean) ** 2).sum() / (total - 1)) if total > 1 else 0.0
    return (a - mean) / (np.sqrt(var) + eps)


def compute_advantages(rewards, group_index, estimator: str, norm_by_std: bool = True,
                       eps: float = 1e-6, lengths=None) -> np.ndarray:
    """Advantages float64[N] of `estimator` (see the module docstring)."""
    fn = ESTIMATORS.get(estimator)
    if fn is None:
        raise ValueError(f"unknown advantage estimator {estimator!r} (known: {', '.join(sorted(ESTIMATORS))})")
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    groups = np.asarray(group_index).reshape(-1)
    if groups.shape != r.shape:
        raise ValueError(f"group_index has {groups.size} entries for {r.size} rewards")
    if lengths is None:
        if estimator == "reinforce_pp_baseline":
            raise ValueError("reinforce_pp_baseline whitens over loss-masked tokens: pass lengths")
        live = np.ones(r.shape, dtype=bool)
        lens = np.ones(r.shape, dtype=np.int64)
    else:
        lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if lens.shape != r.shape or (lens < 0).any():
            raise ValueError(f"lengths must be {r.size} non-negative token counts")
        live = lens > 0
    out = np.zeros(r.shape, dtype=np.float64)
    if live.any():
        _, dense = np.unique(groups[live], return_inverse=True)
        out[live] = fn(r[live], dense.reshape(-1), norm_by_std, float(eps), lens[live])
    return out
