"""Console progress bar fed by metrics lines (step lines advance it; eval lines annotate it).

On a terminal the bar redraws in place; otherwise (logs, CI) it prints one line per 10% of the run.
"""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream=sys.stderr):
        self.total, self.done, self.enabled, self.stream = total, start, enabled, stream
        self.t0 = time.monotonic()
        self.start = start
        self.extra = ""
        self._shown = False
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last_decile = -1

    def update(self, rec: dict) -> None:
        if rec.get("kind") == "step":
            self.done = rec["step"]
            r = rec.get("reward_mean")
            a = rec.get("age_max")
            self.extra = f"reward {r:.3f} age_max {a}" if r is not None else ""
        elif rec.get("kind") == "eval":
            self.extra += f" | eval {rec['reward_mean']:.3f}"
        else:
            return
        if not self.enabled:
            return
        width = 30
        frac = min(1.0, self.done / self.total)
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        el = time.monotonic() - self.t0
        rate = (self.done - self.start) / el if el > 0 else 0.0
        line = f"[{bar}] {self.done}/{self.total} steps {rate:5.1f} it/s {self.extra}"
        if self.tty:
            self.stream.write(f"\r{line}   ")
            self._shown = True
        else:
            decile = int(frac * 10)
            if decile == self._last_decile and rec.get("kind") == "step":
                return
            self._last_decile = decile
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False
