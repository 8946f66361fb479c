"""Stall guard: a loop with nothing pending anywhere and no step left to reach it is stuck.

Every wait of a run has its own bound (a request's environment, a weight sync, a worker's
heartbeat, a checkpoint), but the loop itself can also wait for a state no component will ever
bring: nothing queued or in flight, the trainer idle, no weight sync or checkpoint running, and
yet no prompt admitted (a deterministic run that waited for a wave of a version that was gone
did that, for ever). `StallGuard(bound_s).check(idle, report)` is called once per loop turn:
`idle` is that state; once it has held for `bound_s` (`run.stall_timeout_s`) without a break,
`RunFailed` (exit 1) is raised with `report()`, one line saying where the run stood. Any turn that
is not idle restarts the count. Nothing here waits.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from orchestrator.errors import RunFailed


class StallGuard:
    def __init__(self, bound_s: float, clock: Callable[[], float] = time.monotonic):
        self.bound_s = float(bound_s)
        self.clock = clock
        self.since: Optional[float] = None      # when the idle state began

    def check(self, idle: bool, report: Callable[[], str]) -> None:
        if not idle:
            self.since = None
            return
        now = self.clock()
        if self.since is None:
            self.since = now
        elif now - self.since >= self.bound_s:
            raise RunFailed(f"the run is stalled: nothing queued, in flight, training, syncing or "
                            f"checkpointing for {now - self.since:.0f} s "
                            f"(run.stall_timeout_s={self.bound_s:g}) and nothing admitted; "
                            f"{report()}")
