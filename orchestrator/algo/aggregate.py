"""Loss aggregation: a per-token loss matrix -> one scalar, by verl's mode names.

Contract: `agg_loss(loss_mat, loss_mask, mode, horizon=None) -> Tensor` (a 0-d tensor carrying the
graph of `loss_mat`). `loss_mat` and `loss_mask` are [n, L], one row per sequence (a 1-d input is
one sequence); only positions where `loss_mask` is set count, whatever `loss_mat` holds elsewhere
(inf or nan included). A sequence with no loss-masked token is not a sequence here: it counts in
no mean. With nothing to count the result is 0 (with a gradient of zeros).

Modes (`AGG_MODES`; unknown names raise ValueError naming the known ones):
- `token-mean`: sum over masked tokens / number of masked tokens (DAPO's token-level loss; AReaL's).
- `seq-mean-token-mean`: each sequence's mean over its masked tokens, averaged over sequences
  (the GRPO paper's 1/G sum 1/|o_i|).
- `seq-mean-token-sum`: each sequence's sum over its masked tokens, averaged over sequences.
- `seq-mean-token-sum-norm`: `seq-mean-token-sum` / `horizon`, a constant (Dr. GRPO: the maximum
  completion length), so a sequence's weight does not depend on its length; `horizon` > 0 needed.

Split invariance: `agg_units(loss_mask, mode)` is what a mode averages over (masked tokens for
`token-mean`, sequences with a masked token otherwise). A batch cut into parts (micro-batches,
ranks) has the whole batch's loss as the sum over parts of agg_loss(part) x units(part) /
units(batch): the caller needs the global count, as the token mean needs the global token count.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from orchestrator.algo.registry import registrar

AggFn = Callable[[torch.Tensor, torch.Tensor, Optional[float]], torch.Tensor]
AGG_MODES: dict[str, AggFn] = {}


register_agg = registrar(AGG_MODES, "loss aggregation mode")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    kept = torch.where(mask, x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim)


@register_agg("token-mean")
def _token_mean(mat, mask, horizon):
    return masked_sum(mat, mask) / mask.sum().clamp(min=1)


def _seq_mean(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    live = mask.any(-1)
    return masked_sum(per_seq, live) / live.sum().clamp(min=1)


@register_agg("seq-mean-token-mean")
def _seq_mean_token_mean(mat, mask, horizon):
    return _seq_mean(masked_sum(mat, mask, -1) / mask.sum(-1).clamp(min=1), mask)


@register_agg("seq-mean-token-sum")
def _seq_mean_token_sum(mat, mask, horizon):
    return _seq_mean(masked_sum(mat, mask, -1), mask)


@register_agg("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(mat, mask, horizon):
    if horizon is None or not horizon > 0:
        raise ValueError(f"seq-mean-token-sum-norm divides by a constant horizon > 0 (got {horizon!r})")
    return _seq_mean(masked_sum(mat, mask, -1), mask) / float(horizon)


def _check_mode(mode: str) -> AggFn:
    fn = AGG_MODES.get(mode)
    if fn is None:
        raise ValueError(f"unknown loss aggregation mode {mode!r} (known: {', '.join(AGG_MODES)})")
    return fn


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(0) if t.dim() == 1 else t


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str,
             horizon: Optional[float] = None) -> torch.Tensor:
    """`loss_mat` aggregated over `loss_mask` by `mode` (see the module docstring)."""
    fn = _check_mode(mode)
    mat, mask = _rows(loss_mat), _rows(loss_mask).bool()
    if mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(mat.shape)} and loss_mask {tuple(mask.shape)} differ in shape")
    return fn(mat, mask, horizon)


def agg_units(loss_mask: torch.Tensor, mode: str) -> int:
    """What `mode` averages over in `loss_mask`: masked tokens (`token-mean`) or sequences with a
    masked token (the sequence modes)."""
    _check_mode(mode)
    mask = _rows(loss_mask).bool()
    return int(mask.sum()) if mode == "token-mean" else int(mask.any(-1).sum())
