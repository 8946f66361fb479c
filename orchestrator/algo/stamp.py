"""Per-token policy-version stamps: head (oldest), tail (newest) and run-length encoding.

Computed over the loss-masked tokens of one sequence. The staleness bound and every reported age
use the head: a trajectory that spans versions 3..5 is as old as its version-3 tokens. A sequence
with no live tokens (replayed or externally supplied: versions all -1) has no stamp and is excluded
from the age statistics.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Stamp:
    head: int                       # oldest version among loss-masked live tokens
    tail: int                       # newest
    rle: tuple[tuple[int, int], ...]  # (version, run length) in token order

    @property
    def spans_versions(self) -> bool:
        return self.head != self.tail


def stamp(versions: np.ndarray, loss_mask: np.ndarray) -> Optional[Stamp]:
    """Stamp of one sequence, or None if it has no live loss-masked token."""
    v = versions[loss_mask.astype(bool)]
    if v.size == 0 or (v < 0).any():
        return None
    change = np.flatnonzero(np.diff(v)) + 1
    starts = np.concatenate(([0], change))
    lengths = np.diff(np.concatenate((starts, [v.size])))
    rle = tuple((int(v[s]), int(n)) for s, n in zip(starts, lengths))
    return Stamp(head=int(v.min()), tail=int(v.max()), rle=rle)


def group_head(versions: np.ndarray, loss_mask: np.ndarray) -> Optional[int]:
    """Oldest version among the loss-masked live tokens of a record (a whole rollout group), or None
    when it has none: the head the hard age bound (rollout.max_observed_offpolicyness) judges."""
    v = versions[loss_mask.astype(bool)]
    v = v[v >= 0]
    return int(v.min()) if v.size else None


def token_ages(train_version: int, versions: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """Per-token ages (reported as token_age_*, never as the head age): ages (train_version - token version) of the loss-masked live tokens of a batch."""
    m = loss_mask.astype(bool) & (versions >= 0)
    return (train_version - versions[m]).astype(np.int64)


def sequence_stamps(offsets: np.ndarray, versions: np.ndarray,
                    loss_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every sequence of a batch in one vectorised pass: (heads, tails, live), where live[i] is
    whether sequence i has a stamp (`stamp(...) is not None`) and heads/tails are its stamp's head
    and tail where it does. The step line's head ages are train_version - heads[live]."""
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets) - 1
    if n <= 0 or not len(versions):
        return np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    m = np.asarray(loss_mask).astype(bool)
    v = np.asarray(versions, np.int64)
    big = np.iinfo(np.int64).max
    starts = np.minimum(offsets[:-1], len(v) - 1)        # reduceat needs in-range starts
    heads = np.minimum.reduceat(np.where(m, v, big), starts)
    tails = np.maximum.reduceat(np.where(m, v, -big), starts)
    cum = np.concatenate(([0], np.cumsum(m)))
    masked = cum[offsets[1:]] - cum[offsets[:-1]]
    live = (masked > 0) & (heads >= 0)
    return heads, tails, live


def age_parts(train_version: int, heads: np.ndarray, tails: np.ndarray) -> dict:
    """Where head ages come from, per batch (live sequences' heads and tails): `span_max`, the most
    versions one rollout's tokens span (tail - head: generation that outlived trainer steps; it
    grows when inference is slow against training), and `tail_age_max`, the oldest newest token
    (train_version - tail: a finished rollout waiting for its batch). A head age is the two summed."""
    if not len(heads):
        return {"span_max": None, "tail_age_max": None}
    return {"span_max": int((tails - heads).max()), "tail_age_max": int((train_version - tails).max())}


def age_summary(ages: np.ndarray) -> dict[str, Optional[float]]:
    if ages.size == 0:
        return {"age_max": None, "age_p99": None, "age_mean": None}
    return {"age_max": int(ages.max()),
            "age_p99": float(np.percentile(ages, 99)),
            "age_mean": float(ages.mean())}
