"""Rewards off the decode loop: a pool of daemon threads inside each inference worker.

Contract: `RewardPool(fn, name, tokens, rows, workers, timeout_s, on_error)`. `submit(seqs, row,
is_eval)` queues one finished rollout group (every sample of it is scored against dataset row
`row`); `ready(wait_s=0)` returns the groups whose rewards are all in, rewards filled, in any order,
waiting at most `wait_s` for the pending ones (0: never blocks); `busy()` says whether any group is
still being scored. Each call is `fn(completion_text, row_dict, completion_ids)` on a pool thread,
so a slow reward never stalls generation or the supervisor. With `workers=0` each group is scored
before `submit()` returns, in the order groups finish (for microsecond rewards such as the built-in
`digits`: no hand-off reorders or delays groups), by one reward thread while the worker's main
thread waits, calling `beat()` (the worker's heartbeat, which the worker sets) every
`INLINE_SLICE_S`: a call past `timeout_s` is abandoned there as on a pool thread, so no reward holds
the main thread longer than `timeout_s` a call, and none past the worker's heartbeat timeout.
A call that raises, returns anything but a finite real number (a bool
is not one), or runs longer than `timeout_s` is bad environment output: with `on_error="fail"`
`ready()` raises `BadEnvOutput` naming the function, the row and the prompt (the run exits 2); with
`"zero"` the sample scores 0 and the group's `scalars[REWARD_ERRORS]` counts it (the step line's
`reward_errors`). Samples of a group are scored in order by one thread (few hand-offs between
threads). A timed-out call cannot be killed: its thread is retired (it exits the moment the call
returns, serving nothing more) and a fresh one takes its place and the rest of its group, so live
threads stay <= workers + the stuck cap, `MAX_STUCK_PER_WORKER` x max(workers, 1) timed-out calls still
running, beyond which the run fails (`BadEnvOutput`, whatever `on_error` says). Timeouts are
reported, never absorbed: a warning in the worker log with the counts at the 1st, 2nd, 4th, 8th...
`close()` never blocks: no thread takes a call after it, each ends when its current call returns.
"""
from __future__ import annotations

import itertools
import logging
import math
import numbers
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from orchestrator.data.tokens import ModelTokens, completion_text

log = logging.getLogger(__name__)

REWARD_ERRORS = 0           # Sequences.scalars[REWARD_ERRORS] of a scored group
MAX_STUCK_PER_WORKER = 4
WAIT_SLICE_S = 0.002        # ready(wait_s) re-checks timeouts and `until` this often
INLINE_SLICE_S = 0.05       # workers=0: submit() beats and re-checks timeouts this often


class BadEnvOutput(ValueError):
    """A reward or environment produced unusable output; the run stops with exit 2."""


@dataclass
class _Call:
    seqs: Any
    sample: int
    row: int
    is_eval: bool
    started: Optional[float] = None
    done: bool = False
    finished: Optional[float] = None
    value: Any = None
    error: Optional[BaseException] = None
    scored: Optional[tuple] = None      # (reward, error line or None) once decided
    abandoned: bool = False             # timed out: its thread exits when the call returns


@dataclass
class _Group:
    seqs: Any
    row: int
    calls: list = field(default_factory=list)


class RewardPool:
    def __init__(self, fn: Callable, name: str, tokens: ModelTokens, rows: Callable[[bool, int], dict],
                 workers: int, timeout_s: float, on_error: str):
        self.fn, self.name, self.tokens, self.rows = fn, name, tokens, rows
        self.workers, self.timeout_s, self.on_error = int(workers), float(timeout_s), on_error
        self.beat: Callable[[], None] = lambda: None     # workers=0: called while submit() waits
        self._jobs: "queue.SimpleQueue[Optional[_Group]]" = queue.SimpleQueue()
        self._pending: list[_Group] = []
        self._scored: list = []            # groups scored inside submit(), for ready()
        self._stuck: list[_Call] = []
        self._timeouts = 0
        self._closed = False
        self._cv = threading.Condition()
        self._serial = itertools.count()
        self._threads: list[threading.Thread] = []
        for _ in range(max(self.workers, 1)):
            self._spawn()

    def _spawn(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        t = threading.Thread(target=self._work, name=f"reward-{next(self._serial)}", daemon=True)
        t.start()
        self._threads.append(t)

    def _work(self) -> None:
        while not self._closed:
            group = self._jobs.get()
            if group is None or not self._run(group):
                return

    def _run(self, group: _Group) -> bool:
        """Score the group's unclaimed calls; False when this thread was retired or the pool closed."""
        s = group.seqs
        for call in group.calls:        # one job per group: few hand-offs between threads
            with self._cv:
                if self._closed:
                    return False
                if call.started is not None:    # claimed once: after a timeout a fresh thread
                    continue                    # takes the rest of the group over
                call.started = time.monotonic()
            sl = s.seq(call.sample)
            ids = [int(t) for t in s.tokens[sl][int(s.prompt_lens[call.sample]):]]
            try:
                call.value = self.fn(completion_text(self.tokens, ids),
                                     self.rows(call.is_eval, call.row), ids)
            except BaseException as exc:       # reported by ready(), on the worker's main thread
                call.error = exc
            with self._cv:
                call.finished = time.monotonic()
                call.done = True
                if all(c.done for c in group.calls):    # a group is collected whole: one wake-up
                    self._cv.notify_all()
                if call.abandoned:             # a fresh thread has taken this one's place
                    return False
        return True

    # ------------------------------------------------------------------ main-thread side
    def submit(self, seqs, row: int, is_eval: bool) -> None:
        g = _Group(seqs, row, [_Call(seqs, i, row, is_eval) for i in range(seqs.n)])
        self._pending.append(g)
        self._jobs.put(g)
        while not self.workers and g in self._pending:      # inline: scored before returning
            with self._cv:
                if not all(c.done for c in g.calls):
                    self._cv.wait(INLINE_SLICE_S)
            self.beat()
            self._scored += self._collect()

    def busy(self) -> bool:
        return bool(self._pending or self._scored)

    def _where(self, g: _Group, c: _Call) -> str:
        kind = "eval row" if c.is_eval else "row"
        return f"reward function {self.name!r} {{}} for {kind} {g.row} (prompt {int(g.seqs.prompt_ids[0])})"

    def _score(self, g: _Group, c: _Call, now: float) -> Optional[tuple[float, Optional[str]]]:
        """(reward, error line or None) of a finished or timed-out call; None while it runs."""
        where = self._where(g, c)
        with self._cv:                  # decided under the lock: the thread sees `abandoned` or
            running = not c.done        # the pool sees `done`, never neither
            if running:
                if c.started is None or now - c.started <= self.timeout_s:
                    return None
                c.abandoned = True
        if running:
            return self._replace(g, c, where)
        if c.finished - c.started > self.timeout_s:     # done, but later than allowed
            return 0.0, where.format(f"ran longer than task.reward_timeout_s={self.timeout_s:g}")
        if c.error is not None:
            exc = c.error
            return 0.0, where.format(f"raised {type(exc).__name__}: {exc}".splitlines()[0])
        r = c.value
        if isinstance(r, (bool, np.bool_)) or not isinstance(r, (numbers.Real, np.number)) \
                or not math.isfinite(float(r)):
            return 0.0, where.format(f"returned {r!r}"[:200] + ", not a finite number")
        return float(r), None

    def _replace(self, g: _Group, c: _Call, where: str) -> tuple[float, str]:
        """A call past its timeout: a fresh thread takes its thread's place and the rest of `g`."""
        self._timeouts += 1
        self._stuck = [s for s in self._stuck if not s.done] + [c]
        cap = MAX_STUCK_PER_WORKER * max(self.workers, 1)
        limit = f"task.reward_timeout_s={self.timeout_s:g}"
        if self._timeouts & (self._timeouts - 1) == 0:        # 1, 2, 4, 8, ...
            log.warning("reward function %r timed out %d times so far (%s); %d of its calls still "
                        "running past it (the run fails beyond %d)", self.name, self._timeouts, limit,
                        len(self._stuck), cap)
        if len(self._stuck) > cap:
            raise BadEnvOutput(where.format(f"left more than {cap} calls running past {limit} "
                                            f"({self._timeouts} timeouts in all; it does not return)"))
        self._spawn()
        self._jobs.put(g)               # the rest of the group goes to the fresh thread
        return 0.0, where.format(f"ran longer than {limit}")

    def ready(self, wait_s: float = 0.0, until: Optional[Callable[[], bool]] = None) -> list:
        """Scored groups; waits up to `wait_s` for every pending group to be scored, or until
        `until()` (checked every WAIT_SLICE_S) says there is other work (the worker waits only while
        its backend is idle and no request is waiting, so groups finished together leave together)."""
        out, end = self._scored + self._collect(), time.monotonic() + wait_s
        self._scored = []
        while self._pending and (left := end - time.monotonic()) > 0 and not (until and until()):
            with self._cv:
                if not any(all(c.done for c in g.calls) for g in self._pending):
                    self._cv.wait(min(left, WAIT_SLICE_S))
            out += self._collect()
        return out

    def _collect(self) -> list:
        out, now = [], time.monotonic()
        for g in list(self._pending):
            for c in g.calls:
                if c.scored is None:
                    c.scored = self._score(g, c, now)
            scores = [c.scored for c in g.calls]
            if any(s is None for s in scores):
                continue
            errors = [e for _, e in scores if e is not None]
            if errors and self.on_error == "fail":
                raise BadEnvOutput(errors[0])
            g.seqs.rewards[:] = [v for v, _ in scores]
            g.seqs.scalars = np.array([float(len(errors))], np.float64)
            self._pending.remove(g)
            out.append(g.seqs)
        return out

    def close(self) -> None:
        with self._cv:
            self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        self._pending.clear()
