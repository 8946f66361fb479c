"""Liveness of an inference worker's environment thread: its loop's stamp and the report of a hang.

Contract: `LoopWatch(loop, thread, calls, timeout_s, name, current)`. `tick()`, first scheduled on
the loop (the episode runner does it), stamps `stamp` every TICK_S on the loop's own thread and
sweeps the call pool (`EnvPool.sweep(timeout_s)`: calls past the timeout are abandoned, their
threads replaced). From any thread: `stalled()` is true when the loop has not ticked for longer
than `timeout_s` + TICK_S (an async method that blocks instead of awaiting: no timeout can fire
while it does); `hung(max_stuck)` returns one line naming the environment when the loop stalled
(the call that blocks it, from `current()`: what it is and its code's file, and the line of that
file it blocks at) or when more than
`max_stuck` abandoned calls still run, else None. The worker's main thread calls `hung` each turn
and acts per `task.env_on_hang`.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Callable, Optional

from orchestrator.envs.pool import EnvPool

TICK_S = 0.25


class LoopWatch:
    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, calls: EnvPool,
                 timeout_s: float, name: str, current: Callable[[], Optional[tuple[str, str]]]):
        self.loop, self.thread, self.calls = loop, thread, calls
        self.timeout_s, self.name, self.current = timeout_s, name, current
        self.stamp = time.monotonic()

    def tick(self) -> None:
        self.stamp = time.monotonic()
        self.calls.sweep(self.timeout_s)
        self.loop.call_later(TICK_S, self.tick)

    def stalled(self) -> bool:
        return time.monotonic() - self.stamp > self.timeout_s + TICK_S and self.thread.is_alive()

    def hung(self, max_stuck: int) -> Optional[str]:
        t = self.timeout_s
        if self.stalled():
            late = time.monotonic() - self.stamp
            return (f"{self._blocked_at()} blocked the environment loop for {late:.1f}s (an async "
                    f"method that does not await; task.env_timeout_s={t:g} cannot stop it)")
        stuck = self.calls.stuck()
        if len(stuck) > max_stuck:
            label, age = stuck[0]
            return (f"environment {self.name!r}: {len(stuck)} blocking calls still running past "
                    f"task.env_timeout_s={t:g} (task.env_max_stuck_calls={max_stuck}); the oldest, "
                    f"for {age:.0f}s: {label}")
        return None

    def _blocked_at(self) -> str:
        """The call blocking the loop and the line it blocks at, read from another thread."""
        frames, f = [], sys._current_frames().get(self.thread.ident)
        while f is not None:                    # innermost first
            frames.append(f)
            f = f.f_back
        what, path = self.current() or (f"environment {self.name!r}", None)
        f = next((f for f in frames if f.f_code.co_filename == path), frames[0] if frames else None)
        if f is None:
            return what
        return f"{what} at {os.path.basename(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"
