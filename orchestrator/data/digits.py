"""Built-in digit tasks: small learnable problem sets generated in code, served as datasets.

Contract: `digit_datasets(name, num_eval, seed) -> (train, eval)`, two `Rows` tables with columns
`prompt` (a plain string) and `answer`; they go through the same generic path as a user's dataset
(`prompt_set.PromptSet`, the built-in `digits` reward). `Rows` holds the part of
`datasets.Dataset`'s interface that path reads (`column_names`, `len`, `rows[i] -> dict`,
`select_columns(cols).iter(batch_size)`): a problem set of at most 1000 rows generated in code
needs no Arrow table, and not importing `datasets` (pandas, pyarrow: about 1.3 s) saves that much
in the supervisor and in every inference worker of a built-in job. Every task enumerates a finite
universe of problems; a seeded choice of `min(num_eval, universe // 4)` (at least 1) of them is the
held-out eval set, the rest the training pool. `max_prompt_tokens(name)`: tokens in the longest
prompt under the built-in character tokenizer (bos + one per character), without building anything.
An unknown name raises DataError (a ValueError) naming `task.name`.

Tasks (name: prompt -> answer):
  copy2, copy3        "472>" -> "472"   (copy the digits)
  reverse2, reverse3  "472>" -> "274"
  first3              "472>" -> "4"     (first digit)
  add1                "7+5=" -> "12"    (single-digit sum)
  lookup              "47>"  -> "47"    (the key; the multi-turn `lookup` environment, envs/lookup.py,
                                         hides its value and scores the episode)
The digits reward is positional over tokens: reward = positions of the completion equal to
`answer + eos` / (answer tokens + 1); 1.0 exactly when the answer is followed by eos.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from orchestrator.data.tokens import DataError

_Problem = tuple[str, str]
DEFAULT_EVAL = 64


def _digits(k: int):
    for combo in itertools.product("0123456789", repeat=k):
        yield "".join(combo)


def _copy(k: int) -> Callable[[], list[_Problem]]:
    return lambda: [(s + ">", s) for s in _digits(k)]


def _reverse(k: int) -> Callable[[], list[_Problem]]:
    return lambda: [(s + ">", s[::-1]) for s in _digits(k)]


def _first(k: int) -> Callable[[], list[_Problem]]:
    return lambda: [(s + ">", s[0]) for s in _digits(k)]


def _add1() -> list[_Problem]:
    return [(f"{a}+{b}=", str(a + b)) for a in range(10) for b in range(10)]


TASKS: dict[str, Callable[[], list[_Problem]]] = {
    "copy2": _copy(2), "copy3": _copy(3), "reverse2": _reverse(2), "reverse3": _reverse(3),
    "first3": _first(3), "add1": _add1, "lookup": _copy(2),
}


def task_names() -> list[str]:
    return sorted([*TASKS, "sim", "dataset"])


def _problems(name: str) -> list[_Problem]:
    if name not in TASKS:
        raise DataError(f"invalid config field 'task.name': unknown task {name!r} "
                         f"(choose from {', '.join(task_names())})")
    return TASKS[name]()


def max_prompt_tokens(name: str) -> int:
    return 1 + max(len(prompt) for prompt, _ in _problems(name))


class Rows:
    """An in-memory table of equal-length columns, read as a `datasets.Dataset` is."""

    def __init__(self, columns: dict[str, list]):
        self._cols = {k: list(v) for k, v in columns.items()}
        self._n = len(next(iter(self._cols.values()))) if self._cols else 0
        if any(len(v) != self._n for v in self._cols.values()):
            raise ValueError("Rows: columns of different lengths")

    @property
    def column_names(self) -> list[str]:
        return list(self._cols)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> dict:
        if not -self._n <= i < self._n:
            raise IndexError(f"row {i} of {self._n}")
        return {k: v[i] for k, v in self._cols.items()}

    def select_columns(self, names: list[str]) -> "Rows":
        return Rows({k: self._cols[k] for k in names})

    def iter(self, batch_size: int):
        for start in range(0, self._n, batch_size):
            yield {k: v[start:start + batch_size] for k, v in self._cols.items()}


def digit_datasets(name: str, num_eval, seed: int):
    problems = _problems(name)
    order = np.random.default_rng([int(seed), 0x7A5C]).permutation(len(problems))
    n_eval = max(1, min(int(num_eval or DEFAULT_EVAL), len(problems) // 4))

    def build(idx) -> Rows:
        rows = [problems[int(i)] for i in np.sort(idx)]
        return Rows({"prompt": [p for p, _ in rows], "answer": [a for _, a in rows]})

    return build(order[n_eval:]), build(order[:n_eval])
