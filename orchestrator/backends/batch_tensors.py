"""A columnar batch as torch tensors for the trainer, and the logprobs a model gives them.

Contract: `pad_batch(batch, pad_id, rows)` -> right-padded [n, L] numpy arrays of those sequences
(ids, attention, behaviour logprobs, loss mask, advantages, versions); `pack_batch(batch, pad_id,
rows)` -> the same fields packed end to end in one [1, T] row with position ids restarting per
sequence; `token_logprobs(model, t, temperature, with_entropy)` -> [n, L] logprob of each token
given the ones before it (column 0 is 0) and optionally the sampling distribution's entropy;
`_sequence_rows(t)` -> a function laying a part's tensors out one sequence per row (the identity
for padded parts).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from shm.codec import Sequences


def pad_batch(batch: Sequences, pad_id: int, rows: Optional[list[int]] = None) -> dict[str, np.ndarray]:
    """Right-padded [n, L] arrays of sequences `rows` (None: all): ids, attention, behaviour
    logprobs, loss mask, advantages, versions."""
    rows = list(range(batch.n)) if rows is None else rows
    n = len(rows)
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    lens = np.diff(offsets)[rows]
    width = int(lens.max()) if n else 0
    ids = np.full((n, width), pad_id, dtype=np.int64)
    attn = np.zeros((n, width), dtype=np.int64)
    behav = np.zeros((n, width), dtype=np.float32)
    mask = np.zeros((n, width), dtype=bool)
    adv = np.zeros((n, width), dtype=np.float32)
    vers = np.full((n, width), -1, dtype=np.int64)
    for i, row in enumerate(rows):
        a, b = int(offsets[row]), int(offsets[row + 1])
        k = b - a
        ids[i, :k] = batch.tokens[a:b]
        attn[i, :k] = 1
        behav[i, :k] = batch.logprobs[a:b]
        mask[i, :k] = np.asarray(batch.loss_mask[a:b], dtype=bool)
        adv[i, :k] = float(batch.advantages[row])
        vers[i, :k] = batch.versions[a:b]
    if width:
        mask[:, 0] = False  # the first token has no predicting position
    return {"ids": ids, "attn": attn, "behav": behav, "mask": mask, "adv": adv, "vers": vers}


def pack_batch(batch: Sequences, pad_id: int, rows: list[int]) -> dict[str, np.ndarray]:
    """Sequences `rows` end to end in one [1, T] row, no padding: the arrays of pad_batch plus
    `pos`, position ids restarting at 0 for each sequence (attention stays within a sequence)."""
    parts = [pad_batch(batch, pad_id, [r]) for r in rows]
    out = {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}
    out["pos"] = np.concatenate([np.arange(p["ids"].shape[1]) for p in parts])[None, :]
    return out


def token_logprobs(model, t: dict, temperature: float, with_entropy: bool = False):
    """[n, L] logprob of token t given tokens < t (column 0 is 0) for the tensors of pad_batch or
    pack_batch; with_entropy: also the [n, L] entropy of the sampling distribution at each
    position (column 0 is 0). In a packed row a sequence's first token is never loss-masked, so
    predictions across a boundary never count."""
    ids = t["ids"]
    if "pos" in t:
        out = model(input_ids=ids, position_ids=t["pos"], use_cache=False)
    else:
        out = model(input_ids=ids, attention_mask=t["attn"], use_cache=False)
    logits = out.logits[:, :-1, :].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    picked = torch.nn.functional.pad(logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1), (1, 0))
    if not with_entropy:
        return picked
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, torch.nn.functional.pad(entropy, (1, 0))



def _sequence_rows(t: dict):
    """A function giving [k, L] tensors, one row per sequence, of a part's [n, L] tensors: the
    identity for padded parts; for a packed [1, T] row, each sequence (position ids restarting at
    0) laid out in its own zero-padded row (differentiable: an index_put). The sequence-level
    losses, corrections and aggregations need sequences as rows."""
    if "pos" not in t:
        return lambda x: x
    pos = t["pos"][0]
    seq = torch.cumsum((pos == 0).long(), 0) - 1
    shape = (int(seq[-1]) + 1, int(pos.max()) + 1)
    return lambda x: x.new_zeros(shape).index_put((seq, pos), x[0])

