"""Typed messages over rings, and the doorbell that wakes the supervisor's event thread.

`send(ring, msg, timeout)` encodes a `messages.Msg` and puts it (TimeoutError on a full ring);
`recv(ring, timeout)` returns the next message or None when the ring stays empty that long.
`Bell` is a counting POSIX semaphore used as a wake-up: a worker rings it after each put, the event
thread waits on it with a timeout while every worker->supervisor ring is empty.
"""
from __future__ import annotations

import posix_ipc

from orchestrator import messages


class Bell:
    """Counting semaphore used as a wake-up: post after a put, wait with a timeout."""

    def __init__(self, sem: posix_ipc.Semaphore, owner: bool):
        self._sem, self._owner, self.name = sem, owner, sem.name

    @classmethod
    def create(cls, name: str) -> "Bell":
        return cls(posix_ipc.Semaphore(name, posix_ipc.O_CREX, initial_value=0), True)

    @classmethod
    def attach(cls, name: str) -> "Bell":
        return cls(posix_ipc.Semaphore(name), False)

    def ring(self) -> None:
        self._sem.release()

    def wait(self, timeout: float) -> bool:
        try:
            self._sem.acquire(max(0.0, timeout))
            return True
        except (posix_ipc.BusyError, posix_ipc.SignalError):   # a signal is a wake-up too
            return False

    def close(self) -> None:
        self._sem.close()

    def unlink(self) -> None:
        try:
            posix_ipc.unlink_semaphore(self.name)
        except posix_ipc.ExistentialError:
            pass


def send(ring, msg: messages.Msg, timeout: float = 10.0) -> None:
    ring.put(messages.encode(msg), timeout=timeout)


def recv(ring, timeout: float = 0.0):
    """Next control message, or None if the ring stays empty for `timeout` seconds."""
    try:
        raw = ring.get(timeout=timeout)
    except TimeoutError:
        return None
    return messages.decode(raw)
