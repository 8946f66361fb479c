"""Names and sizes of every shared-memory object of one run, and typed send/receive over rings.

The supervisor creates (and later unlinks) everything named here; workers attach by name. All names
start with `arl_<run_id>_` so the startup sweeper can find segments of dead runs. A doorbell
semaphore lets the supervisor's event thread sleep while every worker->supervisor ring is empty:
a worker rings it after each put.
"""
from __future__ import annotations

from dataclasses import dataclass

import posix_ipc

from orchestrator import messages
from shm.segments import segment_name, sem_name

REQ_RING_BYTES = 1 << 20        # supervisor -> worker control + prompts
OUT_RING_BYTES = 8 << 20        # inference -> supervisor rollout groups
CTL_RING_BYTES = 1 << 20        # worker -> supervisor control
BATCH_RING_BYTES = 32 << 20     # supervisor -> trainer batches


@dataclass(frozen=True)
class RunNames:
    run_id: str
    num_inference: int

    def _n(self, role: str) -> str:
        return segment_name(self.run_id, role)

    @property
    def bell(self) -> str:
        return sem_name(self.version, "bell")     # swept together with the version segment

    @property
    def version(self) -> str:
        return self._n("version")

    @property
    def weights(self) -> str:
        return self._n("weights")

    # `gen` counts restarts of a worker: a restarted worker gets fresh rings
    def req(self, role: str, index: int, gen: int = 0) -> str:
        return self._n(f"req_{role}{index}g{gen}")

    def ctl(self, role: str, index: int, gen: int = 0) -> str:
        return self._n(f"ctl_{role}{index}g{gen}")

    def out(self, index: int, gen: int = 0) -> str:
        return self._n(f"out_inference{index}g{gen}")

    @property
    def batches(self) -> str:
        return self._n("batches")


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
        except posix_ipc.BusyError:
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
