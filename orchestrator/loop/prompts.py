"""The loop's prompt cursor: which prompt stream index is admitted next.

`PromptCursor(task, cursor, redo, quarantine=None)`: `next() -> (stream index, prompt_id, tokens,
row)`; `cursor` is the next new prompt index; prompts to redo (after a resume, or re-admitted by the
hard bound) are served first. A prompt whose row `quarantine` holds (`loop.quarantine`) is not
served: it is handed to `quarantine.skip` and the next one is taken. The prompt source `task` is
built by the workload builder (`data.workload.build_task`, once at launch, before anything starts).
"""
from __future__ import annotations

from collections import deque

import numpy as np


class PromptCursor:
    def __init__(self, task, cursor: int = 0, redo: list[int] = (), quarantine=None):
        self.task = task
        self.cursor = cursor
        self.redo = deque(redo)
        self.quarantine = quarantine

    def next(self) -> tuple[int, int, np.ndarray, int]:
        """(stream index, prompt_id, tokens, dataset row) of the next prompt to admit."""
        while True:             # bounded: Quarantine fails the run before it holds every row
            if self.redo:
                index = self.redo.popleft()
            else:
                index, self.cursor = self.cursor, self.cursor + 1
            pid, tokens, row = self.task.train_prompt(index)
            if self.quarantine is None or not self.quarantine.holds(row):
                return index, pid, tokens, row
            self.quarantine.skip(index, pid)
