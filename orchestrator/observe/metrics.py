"""Metrics: `metrics.jsonl` writer and the metrics thread.

`MetricsLog.write(kind, **fields)` appends one JSON object per line (thread-safe, flushed). The
metrics thread calls a snapshot function every `interval_s`, independent of the training path, and
writes a `kind: tick` line (queue depths, in-flight, gate stats, lag). A failure in the thread is
stored and re-raised by the supervisor's main loop.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Callable, Optional

from orchestrator.run.durable import disk_full


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsLog:
    def __init__(self, path: str, on_write: Optional[Callable[[dict], None]] = None):
        self.path = path
        self.on_write = on_write
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, kind: str, **fields) -> dict:
        rec = {"kind": kind, **{k: _clean(v) for k, v in fields.items()}}
        rec.setdefault("time", time.time())
        line = json.dumps(rec)
        with self._lock:
            try:
                self._f.write(line + "\n")
            except OSError as exc:
                raise disk_full(exc, self.path) from None
        if self.on_write is not None:
            self.on_write(rec)
        return rec

    def sync(self) -> None:
        """Make every line written so far durable (before a checkpoint that covers them commits)."""
        with self._lock:
            try:
                self._f.flush()
                os.fsync(self._f.fileno())
            except OSError as exc:
                raise disk_full(exc, self.path) from None

    def close(self) -> None:
        with self._lock:
            try:
                self._f.close()
            except OSError:          # a full disk: the write that failed was already reported
                pass


class MetricsThread(threading.Thread):
    def __init__(self, log: MetricsLog, snapshot: Callable[[], dict], interval_s: float):
        super().__init__(name="metrics", daemon=True)
        self.log, self.snapshot, self.interval_s = log, snapshot, interval_s
        self._stop_evt = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            while not self._stop_evt.wait(self.interval_s):
                self.log.write("tick", **self.snapshot())
        except BaseException as exc:   # stored; the supervisor re-raises it
            self.error = exc

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_evt.set()
        self.join(timeout)
