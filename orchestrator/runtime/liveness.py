"""Liveness apart from progress: a worker that stops answering at all is noticed within seconds,
whatever one of its steps costs.

Every worker has two words in shared memory (monotonic milliseconds, `shm.counter.SharedCounter`):
- progress (`RunNames.heartbeat`): stamped by the main loop on each turn (`WorkerContext.beat`); a
  step, a save or a reload that never ends leaves it behind. Its deadline is the role's
  `heartbeat_timeout_s`, sized for the slowest legitimate step (600 s for the trainer).
- liveness (`RunNames.liveness`): stamped by `Stamper`, a daemon thread of the worker's own, every
  `STAMP_INTERVAL_S` whatever the main loop does. It stops only when the whole process stops
  (SIGSTOP, a frozen VM, a native call that holds the GIL forever). Its deadline is the role's
  `liveness_timeout_s` (30 s by default).

Worker side: `Stamper(word)` is started by `worker_base.worker_entry` before the worker's main and
stopped (joined, bounded by `STOP_TIMEOUT_S`) in its `finally`: one thread, owned by the entry
function, ending with it. Supervisor side: `overdue(procs, progress, liveness, limits, now_ms)` names
every ready worker past either deadline, with the reason; the supervisor kills it and handles it as
hung (an inference worker is restarted, the trainer fails the run naming it, trainer ranks fail
together). A word still 0 (never stamped: the worker is not ready yet) is never overdue: startup has
`run.startup_timeout_s`.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Optional

STAMP_INTERVAL_S = 0.5
STOP_TIMEOUT_S = 2.0


def now_ms() -> int:
    return max(1, int(time.monotonic() * 1000))


class Stamper:
    """Stamps `word` (anything with `set(int)`) with monotonic ms every `interval_s` on its own
    daemon thread, from `start()` until `stop()`."""

    def __init__(self, word, interval_s: float = STAMP_INTERVAL_S):
        self.word, self.interval_s = word, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

    def start(self) -> "Stamper":
        self.word.set(now_ms())
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.word.set(now_ms())

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT_S)


@dataclass(frozen=True)
class Overdue:
    silent_s: float
    kind: str            # "progress" | "liveness"
    field: str           # the config key whose deadline passed, e.g. "actor.liveness_timeout_s"
    limit_s: float

    def describe(self) -> str:
        if self.kind == "liveness":
            return (f"stopped answering for {self.silent_s:.1f}s ({self.field}={self.limit_s:g}: "
                    f"no liveness stamp, the whole process is stopped or frozen)")
        return f"made no progress for {self.silent_s:.1f}s ({self.field}={self.limit_s:g})"


def overdue(procs: dict, progress: dict, liveness: dict, limits: dict,
            now: Optional[float] = None) -> dict:
    """`procs`: key -> process (`exitcode` None while alive); `progress`/`liveness`: key -> word
    (`get()`); `limits`: role -> {"progress": (field, s), "liveness": (field, s)}. Returns key ->
    `Overdue` for each live worker past a deadline (liveness first: it is the stronger claim)."""
    now = now_ms() if now is None else now
    out = {}
    for key, p in procs.items():
        if p.exitcode is not None:
            continue
        for kind, words in (("liveness", liveness), ("progress", progress)):
            word = words.get(key)
            stamp = word.get() if word is not None else 0
            field, limit = limits[key[0]][kind]
            silent = (now - stamp) / 1000
            if stamp and silent > limit:
                out[key] = Overdue(silent, kind, field, limit)
                break
    return out
