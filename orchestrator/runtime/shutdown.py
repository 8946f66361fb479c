"""The shutdown sequence of a run's processes, bounded by one deadline.

`deadline(signal_at, shutdown_timeout_s)`: after a stop signal, everything is gone within
`run.shutdown_timeout_s` of the signal; otherwise (a run that ended or failed on its own) workers get
at most min(10 s, run.shutdown_timeout_s) from now.
`stop_processes(procs, rings, deadline)`: a `Shutdown` message on every worker's request ring
(never waiting on a full one; trainer rank 0 tells the other ranks), a join of each process until
the deadline, then SIGKILL for whatever is left (workers ignore SIGTERM) and a short join so none is
left a zombie. Returns within the deadline plus about a second per process left to kill.
"""
from __future__ import annotations

import time
from typing import Iterable, Optional

from orchestrator import messages
from orchestrator.wire import send

QUIET_STOP_S = 10.0       # a run that ended on its own gives its workers at most this long


def deadline(signal_at: Optional[float], shutdown_timeout_s: float) -> float:
    if signal_at is not None:
        return signal_at + shutdown_timeout_s
    return time.monotonic() + min(QUIET_STOP_S, shutdown_timeout_s)


def stop_processes(procs: list, rings: Iterable, deadline_at: float) -> None:
    for ring in rings:
        try:
            send(ring, messages.Shutdown(reason="run over"), timeout=0.0)
        except Exception:
            pass

    def left() -> float:
        return max(0.05, deadline_at - time.monotonic())

    for p in procs:
        p.join(left())
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(1.0)
