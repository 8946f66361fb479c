"""Stop signals of the launch process (SIGINT, SIGTERM), caught from its first instant.

`StopSignals.install()` runs before any heavy import, so a signal during config loading, run-dir
checks, startup or resume recovery is recorded instead of raising KeyboardInterrupt or killing the
process half-way. The first signal's number and monotonic time are kept (`signum`, `at`); `event`
is set; callbacks registered with `subscribe` run in the signal handler (keep them to flag writes).
Whoever is running then stops at its next check and the launch exits 128+signum. Workers ignore
both signals: the supervisor alone decides when they stop (a SIGTERM to the whole process group, as
systemd, Slurm or `kill -TERM -PGID` send it, drains and checkpoints like one to the supervisor).
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Callable, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    def __init__(self):
        self.signum: Optional[int] = None
        self.at: Optional[float] = None
        self.event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._old: dict = {}

    def install(self) -> "StopSignals":
        self._old = {s: signal.signal(s, self._on) for s in SIGNALS}
        return self

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def subscribe(self, cb: Callable[[], None]) -> None:
        self._callbacks.append(cb)
        if self.event.is_set():
            cb()

    def _on(self, signum, frame) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
        self.event.set()
        for cb in self._callbacks:
            cb()

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGTERM)


def ignore_in_worker() -> None:
    """Worker processes: the supervisor decides when they stop (Shutdown message, then SIGKILL)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
