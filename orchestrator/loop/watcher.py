"""Weight watcher: poll the trainer's published version -> tell inference to reload -> version++.

`poll()` reads the weight buffer's version word; when it is ahead of the live policy version and no
sync is running, it returns the version every live inference worker must load. When all of them
have acknowledged it, the shared version counter is set (the gate and every component read it) and
the sync latency (publish -> last ack) is returned. Publish times are kept per version
(`note_publish_time(version, t)`): the trainer's next StepDone may arrive while this sync is still
running, or after it committed, and neither may lend its time to another version's sync. With no
publish time for the target (a resume's reload), the latency is poll -> last ack. A sync that
does not finish within `timeout_s` raises `WeightSyncStall` instead of letting the gate close
silently.
"""
from __future__ import annotations

import time
from typing import Callable, Optional


class WeightSyncStall(RuntimeError):
    pass


class WeightWatcher:
    def __init__(self, published: Callable[[], int], counter, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self._published = published
        self.counter = counter
        self.timeout_s = timeout_s
        self.clock = clock
        self.wall = wall
        self.target: Optional[int] = None
        self.waiting: set[int] = set()
        self.started = 0.0
        self.published_at: dict[int, float] = {}    # version -> wall time the trainer published it
        self.last_sync_s: Optional[float] = None

    @property
    def version(self) -> int:
        return self.counter.get()

    def poll(self, live_workers: list[int]) -> Optional[int]:
        if self.target is not None:
            if self.clock() - self.started > self.timeout_s:
                raise WeightSyncStall(
                    f"weight sync to version {self.target} not acknowledged by inference workers "
                    f"{sorted(self.waiting)} within weights.sync_timeout_s={self.timeout_s}")
            return None
        published = self._published()
        if published <= self.version:
            return None
        self.target, self.waiting, self.started = published, set(live_workers), self.clock()
        if not self.waiting:
            self._commit()
        return published

    def note_publish_time(self, version: int, wall_time: float) -> None:
        if version > self.version:               # a committed version's time measures nothing
            self.published_at[version] = wall_time

    def on_ack(self, worker: int, version: int) -> Optional[float]:
        """Returns the sync latency when this ack completes the sync."""
        if self.target is None or version < self.target:
            return None
        self.waiting.discard(worker)
        if self.waiting:
            return None
        return self._commit()

    def forget_worker(self, worker: int) -> Optional[float]:
        if self.target is None:
            return None
        self.waiting.discard(worker)
        return None if self.waiting else self._commit()

    def _commit(self) -> float:
        self.counter.set(self.target)
        when = self.published_at.get(self.target)
        if when is not None:
            self.last_sync_s = max(0.0, self.wall() - when)
        else:
            self.last_sync_s = self.clock() - self.started
        self.published_at = {v: t for v, t in self.published_at.items() if v > self.target}
        self.target = None
        return self.last_sync_s
