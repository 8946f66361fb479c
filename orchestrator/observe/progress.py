"""Console progress, fed by metrics lines, and the summary paragraph at the end of every run.

`Progress(total, start, enabled, S, run_dir)` is a `MetricsLog` hook: `update(rec)` takes every
metrics record (from any thread). On a terminal it drives a tqdm bar (steps/s, ETA, reward, head age
max, last eval); off a terminal (logs, CI) it prints a plain line at each tenth of the run and at
least every `plain_every_s` seconds while steps come. `enabled=False` (`run.progress: false`) shows
nothing while the run goes. `close()` ends the bar; `summary()` is one paragraph on this launch:
steps, wall time, reward start -> end (means of the first and last 10 steps), the last eval, observed
head age max and p99 against S, worker restarts, resumes, the run dir. Launch prints it at the end
of every run that trained a step, however it ended (a run stopped during startup has none).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional

WINDOW = 10             # steps averaged for "reward start -> end"


class Progress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream=sys.stderr,
                 S: Optional[int] = None, run_dir: str = "", plain_every_s: float = 30.0):
        self.total, self.start, self.done = total, start, start
        self.enabled, self.stream, self.S, self.run_dir = enabled, stream, S, run_dir
        self.plain_every_s = plain_every_s
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._bar = None
        self._last_plain = (-1, self.t0)          # (tenth of the run, time) of the last plain line
        self.first: list[float] = []              # reward_mean of this launch's first WINDOW steps
        self.last: list[float] = []               # ... and of its last WINDOW steps
        self.first_step: Optional[int] = None
        self.age_max: Optional[int] = None
        self.age_p99: Optional[float] = None
        self.eval: Optional[dict] = None
        self.restarts = 0
        self.resumes: list[int] = []

    # ------------------------------------------------------------------ records in
    def update(self, rec: dict) -> None:
        with self._lock:
            kind = rec.get("kind")
            if kind == "step":
                self._step(rec)
            elif kind == "eval":
                self.eval = rec
            elif kind == "event":
                if rec.get("event") == "worker_restart":
                    self.restarts += 1
                elif rec.get("event") == "resume":
                    self.resumes.append(int(rec.get("step", 0)))
                return
            else:
                return
            if self.enabled:
                self._show(kind)

    def _step(self, rec: dict) -> None:
        self.done = int(rec["step"])
        if self.first_step is None:
            self.first_step = self.done
        r = rec.get("reward_mean")
        if r is not None:
            if len(self.first) < WINDOW:
                self.first.append(r)
            self.last = (self.last + [r])[-WINDOW:]
        a, p = rec.get("age_max"), rec.get("age_p99")
        if a is not None:
            self.age_max = a if self.age_max is None else max(self.age_max, a)
        if p is not None:
            self.age_p99 = p if self.age_p99 is None else max(self.age_p99, p)

    # ------------------------------------------------------------------ console
    def _status(self) -> str:
        parts = []
        if self.last:
            parts.append(f"reward {self.last[-1]:.3f}")
        if self.age_max is not None:
            parts.append(f"age_max {self.age_max}")
        if self.eval is not None and self.eval.get("reward_mean") is not None:
            parts.append(f"eval {self.eval['reward_mean']:.3f}")
        return " ".join(parts)

    def _show(self, kind: str) -> None:
        if self.tty:
            if self._bar is None:
                from tqdm import tqdm
                try:            # a terminal that reports no size (a bare pty): 100 x 24, else
                    sized = os.get_terminal_size(self.stream.fileno()).columns > 0  # tqdm hides
                except (OSError, ValueError, AttributeError):                     # the bar
                    sized = False
                self._bar = tqdm(total=self.total, initial=self.start, file=self.stream,
                                 unit="step", dynamic_ncols=sized, ncols=None if sized else 100,
                                 nrows=None if sized else 24, smoothing=0.1, leave=True)
            self._bar.update(self.done - self._bar.n)
            self._bar.set_postfix_str(self._status(), refresh=True)
            return
        now = time.monotonic()
        tenth = int(10 * min(1.0, self.done / self.total))
        if kind == "step" and tenth == self._last_plain[0] \
                and now - self._last_plain[1] < self.plain_every_s:
            return
        self._last_plain = (tenth, now)
        el = now - self.t0
        rate = (self.done - self.start) / el if el > 0 else 0.0
        eta = f" eta {(self.total - self.done) / rate:.0f}s" if rate > 0 else ""
        self.stream.write(f"step {self.done}/{self.total} ({100 * self.done // self.total}%) "
                          f"{rate:.1f} steps/s{eta} {self._status()}".rstrip() + "\n")
        self.stream.flush()

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    # ------------------------------------------------------------------ the end
    def summary(self) -> str:
        """One paragraph on this launch (see the module docstring)."""
        with self._lock:
            wall = time.monotonic() - self.t0
            if self.first_step is None:
                steps = f"no step trained in {wall:.1f} s"
            else:
                n = self.done - self.first_step + 1
                steps = (f"steps {self.first_step}-{self.done} of {self.total} in {wall:.1f} s "
                         f"({n / wall if wall > 0 else 0.0:.1f} steps/s)")
            parts = [steps]
            if self.first:
                parts.append(f"reward {_mean(self.first):.3f} (first {len(self.first)}) -> "
                             f"{_mean(self.last):.3f} (last {len(self.last)})")
            if self.eval is not None:
                acc = self.eval.get("accuracy")
                parts.append(f"eval reward {self.eval.get('reward_mean', float('nan')):.3f}"
                             + (f" accuracy {acc:.3f}" if acc is not None else "")
                             + f" at step {self.eval.get('step')}")
            if self.age_max is not None:
                S = f" (S={self.S})" if self.S is not None else ""
                parts.append(f"head age max {self.age_max}, p99 {self.age_p99:g}{S}")
            parts.append(f"worker restarts {self.restarts}")
            at = f" (at step {', '.join(map(str, self.resumes))})" if self.resumes else ""
            parts.append(f"resumes {len(self.resumes)}{at}")
            parts.append(f"run dir {self.run_dir}")
            return "run summary: " + "; ".join(parts) + "."


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")
