"""Trainer ranks fail together; the supervisor names the cause (this module gathers the facts for
its `_ranks_failed` and `_ranks_hung` and turns them into the run's one-line error).

Contract:
- `free_port()`: a TCP port on 127.0.0.1 free right now (the ranks' rendezvous, once per launch);
  `rendezvous_env(rank, world, port)`: the environment `torch.distributed.init_process_group`
  reads (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE) for one rank on this machine.
- `proc_state(pid)`: the kernel's one-letter state of a process ('T': stopped), '' if unreadable.
- `collective_error(error)`: whether a rank's Fatal line only says that a peer went away (a failed
  or timed-out collective), i.e. it is a consequence, not the cause.
- `hang_message(silent, stopped)`: ranks went silent past the progress or liveness deadline. One
  hung rank stalls the others in their next collective, so silence alone does not say which: the
  ranks the kernel shows stopped are named as the cause, else every silent rank.
- `settle(rings, procs, fatal) -> (errors, dead)`: waits up to SETTLE_S until every rank has
  reported a Fatal on its control ring (rank -> its line; `fatal`, a WorkerFatal already received,
  counts) or exited (rank -> (pid, exit code)).
- `kill_hung(procs, silent) -> str`: SIGKILL to every rank (rank -> process) once some went silent
  (rank -> Overdue), reaped within a bounded join, so none is left waiting on a collective; returns
  `hang_message` for them.
- `cause(errors, dead, fatal_index)`: once every rank reported or exited: a rank that died without
  a word (killed) is the cause, else the first whose own error is not a failed collective, else the
  rank that reported first.
"""
from __future__ import annotations

import socket
import time
from typing import Optional

from orchestrator import messages
from orchestrator.wire import recv

SETTLE_S = 3.0          # how long the supervisor waits for every rank to report or exit
_COLLECTIVE = ("DistBackendError", "DistNetworkError", "DistError", "gloo", "NCCL",
               "Connection closed by peer", "Connection reset by peer")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendezvous_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


def collective_error(error: str) -> bool:
    return any(k in error for k in _COLLECTIVE)


def hang_message(silent: dict, stopped: list[int]) -> str:
    """`silent`: rank -> `liveness.Overdue` (how long, which deadline); `stopped`: ranks in state T."""
    ranks = sorted(stopped or silent)
    what = "stopped (SIGSTOP)" if stopped else "hung, or waiting in a collective on a hung rank"
    worst = max([silent[r] for r in ranks if r in silent] or list(silent.values()),
                key=lambda o: o.silent_s)
    return (f"trainer rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
            f"{worst.describe()}: {what}; every rank killed")


def cause(errors: dict[int, str], dead: dict[int, tuple[int, int]],
          fatal_index: Optional[int]) -> str:
    """`errors`: rank -> its Fatal line; `dead`: rank -> (pid, exit code) of exited ranks."""
    for r, (pid, code) in sorted(dead.items()):
        if r not in errors:
            return f"trainer rank {r} (pid {pid}) died with exit code {code}"
    own = [r for r in sorted(errors) if not collective_error(errors[r])]
    r = own[0] if own else (fatal_index if fatal_index is not None else min(errors, default=0))
    return f"trainer rank {r} failed: {errors.get(r, 'exited')}"


def settle(rings: list, procs: dict, fatal=None) -> tuple[dict[int, str], dict[int, tuple[int, int]]]:
    errors = {fatal.index: fatal.error} if fatal is not None else {}
    deadline = time.monotonic() + SETTLE_S
    while True:
        for r, ring in enumerate(rings):
            while (msg := recv(ring, 0.0)) is not None:
                if isinstance(msg, messages.Fatal):
                    errors.setdefault(r, msg.error)
        if time.monotonic() > deadline or all(r in errors or p is None or p.exitcode is not None
                                              for r, p in procs.items()):
            break
        time.sleep(0.05)
    dead = {r: (p.pid, p.exitcode) for r, p in procs.items() if p is not None and p.exitcode is not None}
    return errors, dead


def kill_hung(procs: dict, silent: dict) -> str:
    stopped = [r for r in silent if r in procs and proc_state(procs[r].pid) == "T"]
    message = hang_message(silent, stopped)
    for p in procs.values():
        p.kill()
    for p in procs.values():
        p.join(2.0)
    return message
