"""Prompt sets with verifiable rewards (the `Task` protocol of backends/base.py).

Contract: `make_task(task_cfg, tokenizer, seed) -> Task`; an unknown `task.name` raises ValueError
naming the field. `max_prompt_tokens(name)`: tokens in the longest prompt of a built-in digit task
(bos + one token per character, whatever the tokenizer), without building it.
Every digit task enumerates a finite universe of problems; a seeded choice of
`min(task.num_eval_prompts, universe // 4)` of them is the held-out eval set, the rest form the
training pool. `train_prompt(index)` is deterministic in (seed, index): the training stream of
`task.num_train_prompts` prompts walks seeded permutations of the pool; an index past the stream
wraps (`prompt_id == index % num_train`, as the sim prompts do); eval prompt ids are list positions. Prompts are int32 token arrays that start
with the tokenizer's bos token and end with the task's separator.

Reward: the completion (generated tokens, eos included if sampled) is compared position by position
with `answer + [eos]`; reward = matching positions / (len(answer) + 1), so 1.0 exactly when the
answer is followed by eos, with partial credit on the way. Tokens after eos are never compared.

Built-in tasks (name: prompt -> answer):
  copy2, copy3      "<bos>472>"  -> "472"  (copy the digits)
  reverse2, reverse3 "<bos>472>" -> "274"
  first3            "<bos>472>"  -> "4"    (first digit)
  add1              "<bos>7+5="  -> "12"   (single-digit sum)
  sim               random prompt tokens; reward 0.0 (the sim inference backend decides rewards)
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

import numpy as np

# name -> (universe generator of (prompt text, answer text))
_Problem = tuple[str, str]


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
    "copy2": _copy(2),
    "copy3": _copy(3),
    "reverse2": _reverse(2),
    "reverse3": _reverse(3),
    "first3": _first(3),
    "add1": _add1,
}


class DigitTask:
    """A finite universe of (prompt, answer) string pairs, split into train pool and eval set."""

    def __init__(self, name: str, problems: list[_Problem], tokenizer, num_train: int,
                 num_eval: int, seed: int):
        self.name = name
        self._num_train = int(num_train)
        self._seed = int(seed)
        bos, self.eos = tokenizer.bos_token_id, tokenizer.eos_token_id

        def enc(text: str) -> np.ndarray:
            return np.asarray(tokenizer.convert_tokens_to_ids(list(text)), dtype=np.int32)

        prompts = [np.concatenate([[bos], enc(p)]).astype(np.int32) for p, _ in problems]
        answers = [np.concatenate([enc(a), [self.eos]]).astype(np.int32) for _, a in problems]
        rng = np.random.default_rng([self._seed, 0x7A5C])
        order = rng.permutation(len(problems))
        n_eval = max(1, min(int(num_eval), len(problems) // 4))
        self._eval_idx = np.sort(order[:n_eval])
        self._pool = np.sort(order[n_eval:])
        self._prompts, self._answers = prompts, answers
        self._perm_cache: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ prompt streams
    @property
    def num_train(self) -> int:
        return self._num_train

    @property
    def num_eval(self) -> int:
        return len(self._eval_idx)

    def _train_problem(self, index: int) -> int:
        if not 0 <= index < self._num_train:
            raise IndexError(f"train prompt id {index} outside [0, {self._num_train})")
        epoch, pos = divmod(index, len(self._pool))
        perm = self._perm_cache.get(epoch)
        if perm is None:
            if len(self._perm_cache) > 4:
                self._perm_cache.clear()
            perm = np.random.default_rng([self._seed, 0x51, epoch]).permutation(len(self._pool))
            self._perm_cache[epoch] = perm
        return int(self._pool[perm[pos]])

    def train_prompt(self, index: int) -> tuple[int, np.ndarray]:
        pid = index % self._num_train
        return pid, self._prompts[self._train_problem(pid)].copy()

    def eval_prompts(self) -> list[tuple[int, np.ndarray]]:
        return [(i, self._prompts[int(p)].copy()) for i, p in enumerate(self._eval_idx)]

    def answer(self, prompt_id: int, eval: bool) -> np.ndarray:
        """Target tokens (answer + eos) for a prompt id."""
        problem = int(self._eval_idx[prompt_id]) if eval else self._train_problem(prompt_id)
        return self._answers[problem]

    # ------------------------------------------------------------------------ reward
    def reward(self, prompt_id: int, completion: np.ndarray, eval: bool) -> float:
        target = self.answer(prompt_id, eval)
        got = np.asarray(completion, dtype=np.int64)[: len(target)]
        matches = int(np.sum(got == target[: len(got)]))
        return matches / len(target)


class SimTask:
    """Random prompt tokens for the sim backends; the reward here is a constant 0.0."""

    def __init__(self, num_train: int, num_eval: int, seed: int, prompt_tokens: int = 8,
                 vocab_size: int = 19, low: int = 3):
        self._num_train, self._num_eval = int(num_train), int(num_eval)
        self._seed, self._len = int(seed), int(prompt_tokens)
        self._low, self._high = int(low), int(vocab_size)

    @property
    def num_train(self) -> int:
        return self._num_train

    def _prompt(self, stream: int, index: int) -> np.ndarray:
        rng = np.random.default_rng([self._seed, stream, index])
        return rng.integers(self._low, self._high, size=self._len, dtype=np.int32)

    def train_prompt(self, index: int) -> tuple[int, np.ndarray]:
        pid = index % self._num_train
        return pid, self._prompt(0, pid)

    def eval_prompts(self) -> list[tuple[int, np.ndarray]]:
        return [(i, self._prompt(1, i)) for i in range(self._num_eval)]

    def reward(self, prompt_id: int, completion: np.ndarray, eval: bool) -> float:
        return 0.0


def task_names() -> list[str]:
    return sorted([*TASKS, "sim"])


def max_prompt_tokens(name: str) -> int:
    """Longest prompt of digit task `name` in tokens (DigitTask encodes bos + one id per char)."""
    if name not in TASKS:
        raise ValueError(f"invalid config field 'task.name': unknown task {name!r} "
                         f"(choose from {', '.join(task_names())})")
    return 1 + max(len(prompt) for prompt, _ in TASKS[name]())


def make_task(task_cfg, tokenizer, seed: int, prompt_tokens: Optional[int] = None):
    """Build the task named by `task_cfg.name`; `prompt_tokens` sets the sim prompt length."""
    name = task_cfg.name
    if name == "sim":
        vocab = len(tokenizer) if tokenizer is not None else 19
        return SimTask(task_cfg.num_train_prompts, task_cfg.num_eval_prompts, seed,
                       prompt_tokens=prompt_tokens or 8, vocab_size=vocab)
    if name not in TASKS:
        raise ValueError(f"invalid config field 'task.name': unknown task {name!r} "
                         f"(choose from {', '.join(task_names())})")
    if tokenizer is None:
        raise ValueError(f"task.name {name!r} needs a tokenizer")
    return DigitTask(name, TASKS[name](), tokenizer, task_cfg.num_train_prompts,
                     task_cfg.num_eval_prompts, seed)
