"""How one training batch is split: across trainer ranks by tokens, then into micro-batches.

Contract: `plan(lengths, world, budget) -> list[list[list[int]]]`, a pure function of the sequence
lengths, so every rank computes the same plan from the same batch without a collective:
- ranks: sequences are dealt longest first to the rank with the fewest tokens so far (ties: the
  lowest rank), so ranks carry about the same tokens;
- micro-batches: each rank's sequences, longest first, are packed while the tokens of one forward
  pass stay within `budget`: `count x longest` when padded, the sum of lengths when `packed` (one
  row, no padding); a sequence longer than the budget goes alone. `budget=None`: one micro-batch
  per rank;
- every rank gets the same number of micro-batches (sharded and replicated models run one
  collective per forward and backward, so counts must agree): a rank with fewer gets empty ones
  (`[]`), which the trainer runs as a zero-weight pass.
`plan[r][m]` lists the batch indices of rank r's micro-batch m. Normalisation is the trainer's: each
micro-batch's per-token loss sum is divided by the loss-masked tokens of the whole batch.
"""
from __future__ import annotations

from typing import Optional, Sequence


def split_ranks(lengths: Sequence[int], world: int) -> list[list[int]]:
    """Indices per rank, balanced by tokens (longest-first greedy)."""
    loads = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        out[r].append(i)
        loads[r] += int(lengths[i])
    return out


def micro_batches(indices: Sequence[int], lengths: Sequence[int], budget: Optional[int],
                  packed: bool = False) -> list[list[int]]:
    """Pack `indices` (longest first) into micro-batches of at most `budget` tokens per pass."""
    order = sorted(indices, key=lambda i: (-int(lengths[i]), i))
    if budget is None:
        return [order] if order else []
    out: list[list[int]] = []
    used = 0
    for i in order:
        n = int(lengths[i])
        # the first of a micro-batch is its longest: padded cost is count x first
        cost = used + n if packed else (len(out[-1]) + 1) * int(lengths[out[-1][0]]) if out else n
        if out and cost <= budget:
            out[-1].append(i)
            used = cost
        else:
            out.append([i])
            used = n
    return out


def plan(lengths: Sequence[int], world: int, budget: Optional[int],
         packed: bool = False) -> list[list[list[int]]]:
    per_rank = [micro_batches(idx, lengths, budget, packed) for idx in split_ranks(lengths, world)]
    count = max(1, max(len(m) for m in per_rank))
    return [m + [[] for _ in range(count - len(m))] for m in per_rank]
