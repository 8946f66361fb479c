"""Admission gate that bounds rollout off-policy age (AReaL's StalenessManager semantics).

    capacity = min(C - running, (S + version + 1) * B - (accepted + running))

S = max_head_offpolicyness, B = consumer batch size, C = max concurrent rollouts, version = the live
policy version read from the shared handle on every call. Capacity may be negative (over budget).
A rejected rollout frees staleness capacity (it never becomes `accepted`). After a restart at
version V, `on_version_recovered(V)` sets accepted = V * B so the staleness term does not open
(S + V + 1) * B slots at once. Thread-safe: every method takes one lock.
"""
from __future__ import annotations

import threading
from typing import Callable


class StalenessGate:
    def __init__(self, max_staleness: int, batch_size: int, max_concurrent: int,
                 version: Callable[[], int]):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if batch_size < 1 or max_concurrent < 1:
            raise ValueError("batch_size and max_concurrent must be >= 1")
        self.max_staleness = max_staleness
        self.batch_size = batch_size
        self.max_concurrent = max_concurrent
        self._version = version
        self._lock = threading.Lock()
        self._enqueued = 0
        self._running = 0
        self._accepted = 0
        self._rejected = 0

    def capacity(self) -> int:
        with self._lock:
            version = self._version()
            concurrency = self.max_concurrent - self._running
            staleness = ((self.max_staleness + version + 1) * self.batch_size
                         - (self._accepted + self._running))
            return min(concurrency, staleness)

    def pending_limit(self) -> int:
        return (self.max_staleness + 1) * self.batch_size

    def on_enqueued(self) -> None:
        with self._lock:
            self._enqueued += 1

    def on_submitted(self) -> None:
        with self._lock:
            self._enqueued -= 1
            self._running += 1

    def on_accepted(self) -> None:
        with self._lock:
            self._running -= 1
            self._accepted += 1

    def on_rejected(self) -> None:
        with self._lock:
            self._running -= 1
            self._rejected += 1

    def on_dropped(self) -> None:
        """A finished (accepted) rollout is dropped before training and its prompt re-admitted (the
        hard age bound): counted as a rejection, so it frees staleness capacity."""
        with self._lock:
            self._accepted -= 1
            self._rejected += 1

    def on_aborted(self) -> None:
        """A running rollout was lost (worker died) and will be re-dispatched: running -1 only."""
        with self._lock:
            self._running -= 1

    def on_version_recovered(self, version: int) -> None:
        """Align the accepted counter with a recovered version (nothing is in flight after a restart)."""
        if version < 0:
            raise ValueError(f"recovered version must be >= 0, got {version}")
        with self._lock:
            self._accepted = version * self.batch_size
            self._running = 0
            self._enqueued = 0

    def stats(self) -> dict:
        with self._lock:
            return {"enqueued": self._enqueued, "running": self._running,
                    "accepted": self._accepted, "rejected": self._rejected}

    def state_dict(self) -> dict:
        with self._lock:
            return {"max_staleness": self.max_staleness, "batch_size": self.batch_size,
                    "max_concurrent": self.max_concurrent, "enqueued": self._enqueued,
                    "running": self._running, "accepted": self._accepted, "rejected": self._rejected}

    def load_state_dict(self, d: dict) -> None:
        with self._lock:
            self._enqueued = int(d["enqueued"])
            self._running = int(d["running"])
            self._accepted = int(d["accepted"])
            self._rejected = int(d["rejected"])
