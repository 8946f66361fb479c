"""The loop's prompt cursor: which prompt stream index is admitted next.

`PromptCursor(task, cursor, redo)`: `next() -> (stream index, prompt_id, tokens, row)`; `cursor` is
the next new prompt index; prompts to redo (after a resume, or re-admitted by the hard bound) are
served first. The prompt source `task` is built by the workload builder (`data.workload.build_task`,
once at launch, before anything starts).
"""
from __future__ import annotations

from collections import deque

import numpy as np


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
