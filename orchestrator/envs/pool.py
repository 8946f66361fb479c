"""The environment pool: threads for blocking environment calls that a hung call cannot eat.

Contract: `EnvPool(workers, name)` is a `concurrent.futures.Executor` (`submit`, `shutdown`; `call`
adds a label naming the call) with `workers` threads taking work, started on first use. Its threads
are daemons: a call that never returns cannot hold up the process's exit. `sweep(max_age_s)`
abandons every call running longer than `max_age_s` (the episode runner's loop tick passes
`task.env_timeout_s`; the time counts from the call's start, not its wait in the queue, so calls
queued behind a hung one keep their whole time): its future fails with TimeoutError (the awaiting
episode ends limited), its thread stops counting against `workers`, a fresh thread takes its place
at once, and the abandoned one ends when its call returns, if ever. `stuck()` lists the abandoned calls still running (label,
seconds running), oldest first: the runner reports them past `task.env_max_stuck_calls`.
`shutdown()` cancels queued calls, stops the idle threads and returns at once (`wait`: joins the
counted ones, bounded by JOIN_TIMEOUT_S); a stuck thread is left to the process's exit.
"""
from __future__ import annotations

import concurrent.futures as cf
import functools
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

JOIN_TIMEOUT_S = 5.0


@dataclass(eq=False)
class _Call:
    future: cf.Future
    fn: Callable
    label: str
    t0: float = 0.0
    thread: Optional[threading.Thread] = None
    abandoned: bool = False


class EnvPool(cf.Executor):
    def __init__(self, workers: int, name: str):
        self.workers, self.name = workers, name
        self._work: "queue.SimpleQueue[Optional[_Call]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []      # the counted ones (not abandoned)
        self._running: set[_Call] = set()
        self._spawned = 0
        self._closed = False

    def submit(self, fn, /, *args, **kwargs) -> cf.Future:
        inner = getattr(fn, "func", fn)         # run_tool passes a functools.partial
        return self.call(getattr(inner, "__qualname__", repr(inner)), fn, *args, **kwargs)

    def call(self, label: str, fn, /, *args, **kwargs) -> cf.Future:
        """`submit` with a label naming the call in `stuck()`."""
        fut: cf.Future = cf.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} pool is shut down")
            self._work.put(_Call(fut, functools.partial(fn, *args, **kwargs), label))
            while len(self._threads) < self.workers:
                self._spawn()
        return fut

    def sweep(self, max_age_s: float) -> None:
        """Abandon the calls running longer than `max_age_s` (counted from when they started, not
        from their wait in the queue): their futures fail with TimeoutError, their threads are
        replaced."""
        now, expired = time.monotonic(), []
        with self._lock:
            for c in self._running:
                if not c.abandoned and now - c.t0 > max_age_s:
                    c.abandoned = True
                    expired.append(c)
                    self._threads.remove(c.thread)
                    if not self._closed:
                        self._spawn()
        for c in expired:
            _settle(c.future.set_exception, TimeoutError(f"{c.label} ran longer than {max_age_s:g}s"))

    def stuck(self) -> list[tuple[str, float]]:
        now = time.monotonic()
        with self._lock:
            calls = sorted((c for c in self._running if c.abandoned), key=lambda c: c.t0)
            return [(c.label, now - c.t0) for c in calls]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads)
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item.future.cancel()
            for _ in threads:
                self._work.put(None)
        if wait:
            end = time.monotonic() + JOIN_TIMEOUT_S
            for t in threads:
                t.join(max(0.0, end - time.monotonic()))

    # ------------------------------------------------------------------ pool threads
    def _spawn(self) -> None:
        self._spawned += 1
        t = threading.Thread(target=self._worker, name=f"{self.name}-{self._spawned}", daemon=True)
        self._threads.append(t)
        t.start()

    def _worker(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._work.get()
            if item is None:
                return
            if not item.future.set_running_or_notify_cancel():
                continue
            with self._lock:
                item.t0, item.thread = time.monotonic(), me
                self._running.add(item)
            try:
                result = item.fn()
            except BaseException as exc:        # noqa: BLE001 - handed to the awaiting caller
                _settle(item.future.set_exception, exc)
            else:
                _settle(item.future.set_result, result)
            with self._lock:
                self._running.discard(item)
                if item.abandoned:              # replaced meanwhile: this thread ends
                    return
            del item


def _settle(setter, value) -> None:
    """Complete a future unless the sweep already failed it (an abandoned call that returned)."""
    try:
        setter(value)
    except cf.InvalidStateError:
        pass
