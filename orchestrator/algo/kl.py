"""Per-token KL penalty estimators between the policy and a reference policy (Schulman's k1/k2/k3).

Contract: `kl_penalty(logprobs, ref_logprobs, estimator) -> Tensor` of the inputs' shape, with the
graph of both inputs (the caller detaches the reference). With d = logprobs - ref_logprobs
(the log-ratio pi / pi_ref at the sampled token, sampled from pi):
- `k1`: d (unbiased for KL(pi || pi_ref), high variance, may be negative).
- `k2`: d^2 / 2 (biased, low variance; its gradient is that of the reverse KL's estimate).
- `k3`: exp(-d) - 1 + d (unbiased, always >= 0, low variance; verl's `low_var_kl`), clamped to
  [-10, 10] as verl does (d first to [-20, 20]), so one token far off the reference cannot dominate the loss.
Unknown names raise ValueError naming the known ones (`KL_ESTIMATORS`). Aggregate the result with
`agg_loss` over the loss mask.
"""
from __future__ import annotations

from typing import Callable

import torch

K3_CLAMP = 10.0
LOG_RATIO_CLAMP = 20.0     # d is clamped first so exp stays finite and the gradient is never nan


def _k3(d: torch.Tensor) -> torch.Tensor:
    return (torch.exp(-d) - 1.0 + d).clamp(-K3_CLAMP, K3_CLAMP)

KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda d: d,
    "k2": lambda d: 0.5 * d.square(),
    "k3": lambda d: _k3(d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)),
}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate `estimator` of the policy against the reference (module docstring)."""
    fn = KL_ESTIMATORS.get(estimator)
    if fn is None:
        raise ValueError(f"unknown KL estimator {estimator!r} (known: {', '.join(KL_ESTIMATORS)})")
    return fn(logprobs.float() - ref_logprobs.float())
