"""Prompt source for the supervisor: deterministic prompt `index -> (prompt_id, tokens)`.

The `sim` task is defined here (random token prompts; the sim backend decides rewards). Every other
task name comes from `orchestrator.task.make_task` (built once at startup, never on the hot path).
The cursor is the next new prompt index; prompts to redo after a resume are served first.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from orchestrator.config import Config


class SimPrompts:
    def __init__(self, prompt_tokens: int, num_train: int, num_eval: int, seed: int):
        self.prompt_tokens, self.num_train, self.num_eval, self.seed = (
            prompt_tokens, num_train, num_eval, seed)

    def train_prompt(self, index: int) -> tuple[int, np.ndarray]:
        i = index % self.num_train
        rng = np.random.default_rng((self.seed, i))
        return i, rng.integers(0, 1000, self.prompt_tokens, dtype=np.int32)

    def eval_prompts(self) -> list[tuple[int, np.ndarray]]:
        rng = np.random.default_rng((self.seed, 0, 0xE7A1))     # a stream no train index uses
        return [(i, rng.integers(0, 1000, self.prompt_tokens, dtype=np.int32))
                for i in range(self.num_eval)]


def build_task(cfg: Config):
    if cfg.task.name == "sim":
        return SimPrompts(cfg.inference.sim.prompt_tokens, cfg.task.num_train_prompts,
                          cfg.task.num_eval_prompts, cfg.run.seed)
    from orchestrator.model import build_tokenizer
    from orchestrator.task import make_task
    return make_task(cfg.task, build_tokenizer(cfg.task.name), cfg.run.seed)


class PromptCursor:
    def __init__(self, task, cursor: int = 0, redo: list[int] = ()):
        self.task = task
        self.cursor = cursor
        self.redo = deque(redo)

    def next(self) -> tuple[int, int, np.ndarray]:
        """(stream index, prompt_id, tokens) of the next prompt to admit."""
        if self.redo:
            index = self.redo.popleft()
        else:
            index, self.cursor = self.cursor, self.cursor + 1
        pid, tokens = self.task.train_prompt(index)
        return index, pid, tokens
