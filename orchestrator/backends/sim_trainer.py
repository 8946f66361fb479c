"""`sim` trainer backend: a fixed step time and a fake weight buffer whose every int64 word is the
version it publishes (the sim inference backend checks that on every reload).

Lets the whole loop (ship hold, weight watcher, checkpoint/resume) run in seconds with no model.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from orchestrator.run.durable import atomic_write
from orchestrator.config import SimTrainerConfig
from shm.codec import Sequences


class SimTrainer:
    def __init__(self, cfg: SimTrainerConfig):
        self.cfg = cfg
        self.steps = 0

    def train_step(self, batch: Sequences) -> dict[str, float]:
        if self.cfg.step_time_s:
            time.sleep(self.cfg.step_time_s)
        self.steps += 1
        mask = batch.loss_mask.astype(bool)
        return {"loss": float(-np.mean(batch.advantages)) if batch.n else 0.0,
                "tokens": float(mask.sum())}

    def weight_nbytes(self) -> int:
        return self.cfg.weight_bytes

    def write_weights(self, out: memoryview) -> None:
        arr = np.frombuffer(out, dtype=np.int64, count=len(out) // 8)
        arr[:] = self.steps

    background_save = True

    def snapshot(self):
        """The step count now; `write(directory)` writes it later (a background save)."""
        data = json.dumps({"steps": self.steps}).encode()

        def write(directory: str) -> None:
            time.sleep(self.cfg.save_time_s)        # a slow disk, simulated
            os.makedirs(directory, exist_ok=True)
            atomic_write(os.path.join(directory, "sim_trainer.json"), data)
        return write

    def save(self, directory: str) -> None:
        self.snapshot()(directory)

    def load(self, directory: str) -> None:
        with open(os.path.join(directory, "sim_trainer.json")) as f:
            self.steps = int(json.load(f)["steps"])

    def close(self) -> None:
        pass
