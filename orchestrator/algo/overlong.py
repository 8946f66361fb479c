"""DAPO's overlong handling of completions that run into the length limit, numpy only.

Contract (per sample; `lengths` int[N] are completion lengths in tokens, `max_len` the generation
limit, rollout.max_new_tokens):
- `overlong_penalty(lengths, max_len, buffer_len, factor) -> float64[N]`, each <= 0: DAPO's soft
  overlong punishment (Yu et al. 2025, eq. 13) scaled by `factor` as verl's overlong buffer:
  0 while |y| <= max_len - buffer_len, then ((max_len - buffer_len) - |y|) / buffer_len x factor,
  falling linearly to -factor at |y| = max_len (and -factor beyond). It is added to the reward
  before the advantages. `buffer_len` is in 1..max_len.
- `cut_at_limit(lengths, last_tokens, max_len, stop_ids) -> bool[N]`: the completions the engine
  cut: they reached `max_len` tokens and their last token is not a stop token (a completion that
  ends with its stop token exactly at the limit finished on its own). DAPO's overlong filtering
  masks these out of the loss.
Both refuse negative lengths and bad limits with ValueError.
"""
from __future__ import annotations

import numpy as np


def _lengths(lengths) -> np.ndarray:
    out = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if (out < 0).any():
        raise ValueError("completion lengths must be non-negative")
    return out


def overlong_penalty(lengths, max_len: int, buffer_len: int, factor: float = 1.0) -> np.ndarray:
    """Soft overlong punishment per sample (module docstring)."""
    if not 1 <= buffer_len <= max_len:
        raise ValueError(f"buffer_len must be in 1..max_len={max_len} (got {buffer_len})")
    n = _lengths(lengths).astype(np.float64)
    expected = max_len - buffer_len
    return np.clip((expected - n) / buffer_len, -1.0, 0.0) * float(factor)


def cut_at_limit(lengths, last_tokens, max_len: int, stop_ids) -> np.ndarray:
    """Completions cut by the length limit (module docstring)."""
    n = _lengths(lengths)
    last = np.asarray(last_tokens, dtype=np.int64).reshape(-1)
    if last.shape != n.shape:
        raise ValueError(f"last_tokens has {last.size} entries for {n.size} lengths")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1 (got {max_len})")
    return (n >= max_len) & ~np.isin(last, np.asarray(list(stop_ids), dtype=np.int64))
