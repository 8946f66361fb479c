"""A weighted mixture of datasets (`task.datasets`): one training stream whose prompts name their source.

The stream is a pure function of (run.seed, index), as a single dataset's is, so a resume redoes
and continues it exactly: index i draws its source from a generator keyed by (seed, i // BLOCK)
(BLOCK draws at a time, with probability weight / sum of weights), and takes that source's next
prompt: the p-th prompt of source s, p the draws of s before i, is its own `PromptSet`'s stream
position p (each source walks its own seeded epochs, every kept row once per epoch), as
`datasets.interleave_datasets` with probabilities does for an endless stream. The counts before
each block are kept (one small vector per BLOCK indices), so finding index i costs one block's draws.

Rows are numbered across the sources (source s's row r is `offset[s] + r`, offsets by dataset
length, train and eval apart), so the rest of the runtime (requests, quarantine, checkpoints)
keeps one int per prompt. A worker's row lookup adds `data_source` (verl's name) = the source's
name to the row its reward or environment sees.

Contract:
- `Mixture(sets, labels, weights, seed, num_train)` (supervisor; `sets` the sources' `PromptSet`s):
  `train_prompt(index) -> (index % num_train, ids, row)`, `eval_prompts()` (every source's eval
  prompts, positions renumbered), `source_of(index)` (the training stream) and
  `eval_source(row)`: a source's name; `labels`; `max_prompt_tokens`, `filtered` and `identity`
  (the sources' prompts and digests with their names and weights: a changed weight changes the
  stream, and a resume refuses it, as a changed dataset).
- `MixtureRows(train, eval, labels)` (workers): `rows(is_eval, row) -> dict` with `data_source`.
- `by_source(fns) -> fn`: the reward that calls the row's source's function.
- `source_means(labels, rewards) -> dict`: `reward_mean/<name>` of each source present (the mean
  of its samples' rewards), the per-source fields of step lines (the batch's trained groups) and
  eval lines (the round's groups).
"""
from __future__ import annotations

import bisect
import hashlib
from typing import Callable, Optional

import numpy as np

BLOCK = 4096
SOURCE_STREAM = 0x3D1          # the generator stream of the source draws (no other stream uses it)


def _offsets(lengths) -> list[int]:
    return [0] + list(np.cumsum(list(lengths), dtype=np.int64)[:-1].tolist())


def _source_at(offsets: list[int], row: int) -> int:
    """The source whose rows (numbered across sources from `offsets`) hold global row `row`."""
    return bisect.bisect_right(offsets, int(row)) - 1


def source_seed(seed: int, source: int) -> int:
    """The seed of source `source`'s own stream (its epochs' permutations, its eval choice)."""
    return int(np.random.SeedSequence([int(seed), 0x3D2, source]).generate_state(1, np.uint64)[0]
               >> 1)


class SourceDraws:
    """Which source each stream index draws, and how many draws of it came before."""

    def __init__(self, weights, seed: int):
        w = np.asarray(weights, dtype=np.float64)
        self.p = w / w.sum()
        self.seed = int(seed)
        self._starts = [np.zeros(len(w), np.int64)]   # draws of each source before block b
        self._blocks: dict[int, np.ndarray] = {}

    def _block(self, b: int) -> np.ndarray:
        got = self._blocks.get(b)
        if got is None:
            if len(self._blocks) > 4:
                self._blocks.clear()
            rng = np.random.default_rng([self.seed, SOURCE_STREAM, b])
            got = self._blocks[b] = rng.choice(len(self.p), BLOCK, p=self.p)
        return got

    def locate(self, index: int) -> tuple[int, int]:
        """(source, position in that source's own stream) of stream index `index`."""
        b, off = divmod(int(index), BLOCK)
        while len(self._starts) <= b:
            n = len(self._starts) - 1
            self._starts.append(self._starts[n] + np.bincount(self._block(n), minlength=len(self.p)))
        draws = self._block(b)
        s = int(draws[off])
        return s, int(self._starts[b][s] + np.count_nonzero(draws[:off] == s))


class Mixture:
    def __init__(self, sets: list, labels: list[str], weights: list[float], seed: int,
                 num_train: int):
        self.sets, self.labels, self.num_train = list(sets), list(labels), int(num_train)
        self.draws = SourceDraws(weights, seed)
        self._train_at = _offsets(len(s.train) for s in self.sets)
        self._eval_at = _offsets(0 if s.eval is None else len(s.eval) for s in self.sets)
        self.max_prompt_tokens = max(s.max_prompt_tokens for s in self.sets)
        self.filtered = sum(s.filtered for s in self.sets)
        digest = hashlib.blake2b(digest_size=16)
        for label, w, s in zip(self.labels, weights, self.sets):
            digest.update(f"{label}\0{float(w)!r}\0{s.identity['digest']}\0".encode())
        self.identity = {"prompts": sum(s.identity["prompts"] for s in self.sets),
                         "digest": digest.hexdigest()}

    def source_of(self, index: int) -> str:
        return self.labels[self.draws.locate(index)[0]]

    def eval_source(self, row: int) -> str:
        return self.labels[_source_at(self._eval_at, row)]

    def train_prompt(self, index: int) -> tuple[int, np.ndarray, int]:
        s, pos = self.draws.locate(index)
        _, ids, row = self.sets[s].train_prompt(pos)
        return index % self.num_train, ids, self._train_at[s] + row

    def eval_prompts(self) -> list[tuple[int, np.ndarray, int]]:
        out = []
        for s, ps in enumerate(self.sets):
            for _, ids, row in ps.eval_prompts():
                out.append((len(out), ids, self._eval_at[s] + row))
        return out


class MixtureRows:
    def __init__(self, train: list, evals: list, labels: list[str]):
        self.train, self.evals, self.labels = train, evals, labels
        self._train_at = _offsets(len(d) for d in train)
        self._eval_at = _offsets(0 if d is None else len(d) for d in evals)

    def __call__(self, is_eval: bool, row: int) -> dict:
        at = self._eval_at if is_eval else self._train_at
        s = _source_at(at, row)
        ds: Optional[object] = (self.evals if is_eval else self.train)[s]
        got = dict(ds[int(row) - at[s]])
        got["data_source"] = self.labels[s]
        return got


def by_source(fns: dict[str, Callable]) -> Callable:
    """One reward for a mixture: each row is scored by its source's function."""
    def reward(completion, row, *rest):
        return fns[row["data_source"]](completion, row, *rest)
    return reward


def source_means(labels, rewards) -> dict:
    """{"reward_mean/<name>": mean of the rewards of that source's groups} (`labels[i]` names the
    source of group i, `rewards[i]` its samples' rewards); sources absent from the groups are left
    out (their mean is undefined, not 0)."""
    by: dict[str, list] = {}
    for label, r in zip(labels, rewards):
        by.setdefault(label, []).append(np.asarray(r, dtype=np.float64))
    return {f"reward_mean/{k}": float(np.concatenate(v).mean()) for k, v in sorted(by.items())
            if sum(x.size for x in v)}
