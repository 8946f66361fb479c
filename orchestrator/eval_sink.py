"""Eval sink: collects the rollouts of one eval round (no advantages, no filtering) and reports
their mean reward once every request of the round has come back."""
from __future__ import annotations

from typing import Optional

import numpy as np

from shm.codec import Sequences


class EvalSink:
    def __init__(self):
        self.step: Optional[int] = None
        self.expected: set[int] = set()
        self.rewards: list[float] = []
        self.lengths: list[int] = []

    @property
    def active(self) -> bool:
        return self.step is not None

    def start(self, step: int, request_ids: list[int]) -> None:
        self.step, self.expected, self.rewards, self.lengths = step, set(request_ids), [], []

    def add(self, request_id: int, group: Sequences) -> Optional[dict]:
        """Add one finished eval group; returns the summary when the round is complete."""
        if request_id not in self.expected:
            return None
        self.expected.discard(request_id)
        self.rewards.extend(float(r) for r in group.rewards)
        self.lengths.extend(int(group.loss_mask[group.seq(i)].sum()) for i in range(group.n))
        if self.expected:
            return None
        out = {"kind": "eval", "step": self.step, "reward_mean": float(np.mean(self.rewards)),
               "samples": len(self.rewards), "completion_len_mean": float(np.mean(self.lengths))}
        self.step = None
        return out
