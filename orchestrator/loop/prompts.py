"""The loop's prompt cursor: which prompt stream index is admitted next.

`PromptCursor(task, cursor, redo, quarantine=None)`: `next() -> (stream index, prompt_id, tokens,
row)`; `cursor` is the next new prompt index; prompts to redo (after a resume, or re-admitted by the
hard bound) are served first. A prompt whose row `quarantine` holds (`loop.quarantine`) is not
served: it is handed to `quarantine.skip` and the next one is taken. The prompt source `task` is
built by the workload builder (`data.workload.build_task`, once at launch, before anything starts).
`source_fields(groups, index_of)`: a mixture's (`data.mixture`) per-source `reward_mean/<name>` of
a batch's groups (`index_of`: request id -> stream index); {} for one dataset or a built-in task.
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

    def source_fields(self, groups, index_of: dict) -> dict:
        source_of = getattr(self.task, "source_of", None)
        if source_of is None:
            return {}
        from orchestrator.data.mixture import source_means
        known = [g for g in groups if g.ident in index_of]
        return source_means([source_of(index_of[g.ident]) for g in known], [g.rewards for g in known])

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
