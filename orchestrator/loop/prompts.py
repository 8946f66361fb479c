"""Prompt source for the supervisor: deterministic prompt `index -> (prompt_id, tokens, row)`.

`build_task(cfg)`: the `sim` task (random token prompts; the sim backend decides rewards) is defined
here; every other task, built-in digit task or `task.dataset`, is a `data.prompt_set.PromptSet`
built by `data.workload.load_prompts` (once, at launch, before anything starts; a `DataError` there
is exit 2). Both expose `max_prompt_tokens` (the rings are sized from it), `train_prompt(index)` and
`eval_prompts()`. The cursor is the next new prompt index; prompts to redo after a resume are served
first.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from orchestrator.config import Config
from orchestrator.data.digits import DEFAULT_EVAL

NO_ROW = -1         # a prompt with no dataset row (sim)


class SimPrompts:
    def __init__(self, prompt_tokens: int, num_train: int, num_eval: int, seed: int):
        self.prompt_tokens, self.num_train, self.num_eval, self.seed = (
            prompt_tokens, num_train, num_eval, seed)
        self.max_prompt_tokens = prompt_tokens
        self.filtered = 0
        self.identity = None          # a pure function of the config: nothing to compare

    def train_prompt(self, index: int) -> tuple[int, np.ndarray, int]:
        i = index % self.num_train
        rng = np.random.default_rng((self.seed, i))
        return i, rng.integers(0, 1000, self.prompt_tokens, dtype=np.int32), NO_ROW

    def eval_prompts(self) -> list[tuple[int, np.ndarray, int]]:
        rng = np.random.default_rng((self.seed, 0, 0xE7A1))     # a stream no train index uses
        return [(i, rng.integers(0, 1000, self.prompt_tokens, dtype=np.int32), NO_ROW)
                for i in range(self.num_eval)]


def build_task(cfg: Config):
    if cfg.task.name == "sim":
        return SimPrompts(cfg.inference.sim.prompt_tokens, cfg.task.num_train_prompts,
                          cfg.task.num_eval_prompts or DEFAULT_EVAL, cfg.run.seed)
    from orchestrator.data.workload import load_prompts
    return load_prompts(cfg)


class PromptCursor:
    def __init__(self, task, cursor: int = 0, redo: list[int] = ()):
        self.task = task
        self.cursor = cursor
        self.redo = deque(redo)

    def next(self) -> tuple[int, int, np.ndarray, int]:
        """(stream index, prompt_id, tokens, dataset row) of the next prompt to admit."""
        if self.redo:
            index = self.redo.popleft()
        else:
            index, self.cursor = self.cursor, self.cursor + 1
        pid, tokens, row = self.task.train_prompt(index)
        return index, pid, tokens, row
