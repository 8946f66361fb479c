"""Eval sink: collects the rollouts of one eval round (no advantages, no filtering) and reports,
once every request of the round has come back, one `"kind": "eval"` line: `reward_mean`,
`accuracy` (the fraction of samples with full reward, >= 1), `samples`, `prompts`,
`completion_len_mean`."""
from __future__ import annotations

from typing import Optional

import numpy as np

from shm.codec import Sequences

FULL_REWARD = 1.0


class EvalSink:
    def __init__(self):
        self.step: Optional[int] = None
        self.expected: set[int] = set()
        self.rewards: list[float] = []
        self.lengths: list[int] = []
        self.prompts = 0

    @property
    def active(self) -> bool:
        return self.step is not None

    def start(self, step: int, request_ids: list[int]) -> None:
        self.step, self.expected, self.rewards, self.lengths = step, set(request_ids), [], []
        self.prompts = len(request_ids)

    def add(self, request_id: int, group: Sequences) -> Optional[dict]:
        """Add one finished eval group; returns the summary when the round is complete."""
        if request_id not in self.expected:
            return None
        self.expected.discard(request_id)
        self.rewards.extend(float(r) for r in group.rewards)
        self.lengths.extend(int(group.loss_mask[group.seq(i)].sum()) for i in range(group.n))
        if self.expected:
            return None
        rewards = np.asarray(self.rewards, dtype=np.float64)
        out = {"kind": "eval", "step": self.step, "reward_mean": float(rewards.mean()),
               "accuracy": float((rewards >= FULL_REWARD).mean()), "samples": len(rewards),
               "prompts": self.prompts, "completion_len_mean": float(np.mean(self.lengths))}
        self.step = None
        return out
