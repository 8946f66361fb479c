"""SharedCounter: one int64 in its own shm segment; the run's policy-version handle.

Contract: `SharedCounter.create(name, initial=0)` in the owner, `SharedCounter.attach(name, timeout=10)`
in every reader; `get() -> int`, `set(v)`, `close()`, `unlink()` (owner only). The value is one
8-byte aligned word right after the common header (shm.segments), so loads and stores are single
instructions: a reader sees either the old or the new value, never a mix. One writer at a time.
"""
from __future__ import annotations

from shm.segments import HEADER_SIZE, KIND_COUNTER, Mapped, Segment

_WORD = HEADER_SIZE // 8                      # int64 index of the value


class SharedCounter(Mapped):
    def __init__(self, seg: Segment):
        self._seg = seg
        self.name = seg.name
        self._q = memoryview(seg.mm).cast("q")

    @classmethod
    def create(cls, name: str, initial: int = 0) -> "SharedCounter":
        seg = Segment.create(name, 64, KIND_COUNTER,
                             init=lambda mm: mm.__setitem__(slice(HEADER_SIZE, HEADER_SIZE + 8),
                                                            int(initial).to_bytes(8, "little", signed=True)))
        return cls(seg)

    @classmethod
    def attach(cls, name: str, timeout: float = 10.0) -> "SharedCounter":
        return cls(Segment.attach(name, KIND_COUNTER, timeout))

    def get(self) -> int:
        return self._q[_WORD]

    def set(self, v: int) -> None:
        self._q[_WORD] = v

    def _views(self) -> tuple:
        return (self._q,)
