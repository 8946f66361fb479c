"""The learning-rate schedule: `lr_at(step, *, lr, total_steps, schedule="constant",
min_ratio=0.1, warmup_steps=0) -> float`, a pure function of the 1-based trainer step (so a
resumed run continues exactly where it stopped).

- warm-up (`warmup_steps` = N > 0): steps 1..N take lr * step / N (step N trains at lr), as verl's
  `lr_warmup_steps`; Adam's first updates move every parameter by about lr whatever the size of
  its gradient, and the first batches' advantages are mostly noise;
- then `constant` (lr) or `cosine` over the steps left, N + 1 .. total_steps, from lr down to
  lr * min_ratio at the last step.
"""
from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, total_steps: int, schedule: str = "constant",
          min_ratio: float = 0.1, warmup_steps: int = 0) -> float:
    if warmup_steps and step <= warmup_steps:
        return lr * max(step, 1) / warmup_steps
    span = total_steps - warmup_steps
    if schedule == "constant" or span <= 1:
        return lr
    if schedule != "cosine":
        raise ValueError(f"unknown lr schedule {schedule!r} (constant or cosine)")
    frac = min(1.0, max(0.0, (step - warmup_steps - 1) / (span - 1)))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))
