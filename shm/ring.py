"""SPSC ring of variable-size byte records over POSIX shared memory.

Contract (shared/ARCHITECTURE.md): `Ring.create(name, capacity_bytes)` in the owner,
`Ring.attach(name, timeout=10.0)` in the peer; exactly one process (thread) puts and one gets, either
side may be the writer. `put(data, timeout=None)` takes a bytes-like record (raises ValueError if it can never
fit, TimeoutError if no space in time); `get(timeout=None)` returns the next record as `bytes` or
raises TimeoutError; `close()`; `unlink()` (owner only). A torn or inconsistent record raises
`CorruptRecord`; wrong bytes are never returned. Sizing: `Ring.record_space(nbytes)` is the ring
space one record takes (a ring holds it iff its capacity is at least that); `Ring.shm_bytes(capacity)`
the /dev/shm bytes a ring takes (page-rounded segment plus its two semaphores).

Layout (after the 64-byte common header of shm.segments): a writer cache line (head, writer-sleeping
ticket, writer pid), a reader cache line (tail, reader-sleeping ticket, reader pid), a
config line, then `capacity` data bytes. head/tail are monotonically increasing 64-bit byte counters
(aligned int64 stores are single instructions). Records are contiguous and 16-byte aligned:
[pos:i64][len:u32 | check:u32 << 32][payload]; `pos` is the record's own counter value, `check` mixes
pos and len. When a record does not fit before the end, the writer publishes a wrap marker
(len = 0xFFFFFFFF) that moves head to the next lap, then places the record at offset 0.

Commit protocol: payload first, then the record header, then head (published last). A writer killed
at any point leaves head unchanged, so the reader never sees the partial record. The reader checks
pos/len/check/bounds of every record it consumes and raises CorruptRecord on any mismatch.

Fast path: when the C extension `shm._ringfast` is built (setup.py; skipped without a compiler, or
with ARL_RING_PURE_PYTHON=1), put/get of a record that needs no wrap and no wait, and the spin
phase of a get, run in C with the same layout, commit protocol and fences; everything else (wrap
markers, sleeping, timeouts, corrupt records) runs the Python code below.

Waiting: spin for `spin_us` (sched_yield between polls after the first 5 us, so a peer waiting for
this CPU on an oversubscribed machine runs at once), then announce sleeping (a fresh nonzero ticket
in the header), fence, re-check, and block on a posix_ipc semaphore in bounded slices (50 ms, so
`timeout=None` still re-checks). The peer, after publishing, fences and posts the semaphore once per
ticket it sees. The fences (lock acquire/release = atomic RMWs, full barriers on x86-64) order
"store index; load peer's ticket" against "store ticket; load index", so no wakeup is lost.
"""
from __future__ import annotations

import os
import threading
import time

import posix_ipc

from shm import segments
from shm.segments import HEADER_SIZE, KIND_RING, PAGE, Mapped, Segment, pid_alive

try:        # the C fast path (shm/_ringfast.c); ARL_RING_PURE_PYTHON=1 or no compiler: pure Python
    from shm._ringfast import Core as _Core
except ImportError:
    _Core = None
if os.environ.get("ARL_RING_PURE_PYTHON"):
    _Core = None

__all__ = ["Ring", "CorruptRecord"]


class CorruptRecord(RuntimeError):
    """The ring holds a record that fails its consistency checks (torn write or foreign bytes)."""


# int64 word indices into the segment
_HEAD, _W_WAIT, _W_PID = 8, 9, 10                    # writer line   (bytes 64..127)
_TAIL, _R_WAIT, _R_PID = 16, 17, 18                  # reader line   (bytes 128..191)
_CAP = 24                                             # config line   (bytes 192..255)
_DATA = 256                                           # first data byte
_REC = 16                                             # record header bytes, also record alignment
_WRAP = 0xFFFFFFFF
_M32 = 0xFFFFFFFF
_MIX = 0x5BD1E995
_SLICE = 0.05                                         # longest single semaphore wait (s)
_HOT_SPIN = 5e-6                                      # pure spin; after it, spin with sched_yield
_fence_lock = threading.Lock()
_acq, _rel = _fence_lock.acquire, _fence_lock.release
_now = time.perf_counter
_yield = os.sched_yield


class Ring(Mapped):
    def __init__(self, seg: Segment, spin_us: float):
        self._seg, self._mm = seg, seg.mm
        self._mv = memoryview(seg.mm)
        self._q = self._mv.cast("Q")
        self.name, self.capacity = seg.name, self._q[_CAP]
        self.spin_s = spin_us * 1e-6
        self._sem_data = posix_ipc.Semaphore(segments.sem_name(seg.name, "data"))
        self._sem_space = posix_ipc.Semaphore(segments.sem_name(seg.name, "space"))
        self._head = self._peer_tail = None              # writer-side cache
        self._tail = self._peer_head = None              # reader-side cache
        self._ticket = time.monotonic_ns()                # sleep tickets never repeat across objects
        self._posted_r = self._posted_w = 0
        self.sleeps = self.late_wakeups = 0               # this object's waits (diagnostics)
        self._core = None if _Core is None else _Core(
            seg.mm, self.capacity, segments.sem_name(seg.name, "data"),
            segments.sem_name(seg.name, "space"))

    # ---- sizing ----------------------------------------------------------------------------
    @staticmethod
    def record_space(nbytes: int) -> int:
        """Ring bytes one record of `nbytes` takes (header + 16-byte alignment, as put computes)."""
        return (nbytes + 31) & ~15

    @staticmethod
    def shm_bytes(capacity_bytes: int) -> int:
        """/dev/shm bytes of a ring created with `capacity_bytes`: segment pages + two semaphores."""
        size = _DATA + ((capacity_bytes + 63) & ~63)
        return (size + PAGE - 1) // PAGE * PAGE + 2 * PAGE

    # ---- lifecycle -------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, capacity_bytes: int, spin_us: float = 50.0) -> "Ring":
        if capacity_bytes < 64:
            raise ValueError(f"ring capacity must be >= 64 bytes, got {capacity_bytes}")
        cap = (capacity_bytes + 63) & ~63

        def init(mm):
            mm[_CAP * 8:_CAP * 8 + 8] = cap.to_bytes(8, "little")
            try:
                for suffix in ("data", "space"):
                    posix_ipc.Semaphore(segments.sem_name(name, suffix), posix_ipc.O_CREX, 0o600, 0).close()
            except BaseException:
                for suffix in ("data", "space"):
                    segments.unlink_quietly(segments.sem_name(name, suffix), semaphore=True)
                raise

        seg = Segment.create(name, _DATA - HEADER_SIZE + cap, KIND_RING, init=init)
        try:
            return cls(seg, spin_us)
        except BaseException:
            cls._unlink_names(name)
            seg.close()
            raise

    @classmethod
    def attach(cls, name: str, timeout: float = 10.0, spin_us: float = 50.0) -> "Ring":
        seg = Segment.attach(name, KIND_RING, timeout)
        try:
            return cls(seg, spin_us)
        except BaseException:
            seg.close()
            raise

    @staticmethod
    def _unlink_names(name: str) -> None:
        for suffix in ("data", "space"):
            segments.unlink_quietly(segments.sem_name(name, suffix), semaphore=True)
        segments.unlink_quietly(name)

    def _before_close(self) -> None:
        if self._core is not None:
            self._core.release()                          # drops its export of the mapping
        self._sem_data.close()
        self._sem_space.close()

    def _views(self) -> tuple:
        return (self._q, self._mv)

    def unlink(self) -> None:
        """Remove the names (owner only); mappings stay valid until closed."""
        if not self._seg.owner:
            raise RuntimeError(f"only the owner of ring {self.name} may unlink it")
        self._unlink_names(self.name)

    # ---- writer ----------------------------------------------------------------------------
    def put(self, data, timeout: float | None = None) -> None:
        """Append one record (bytes-like, C-contiguous). Blocks up to `timeout` s for space."""
        core = self._core
        if core is not None:
            if self._head is None:
                self._start_writer()
            if core.put(data):
                return
            self._head, self._peer_tail = self._q[_HEAD], self._q[_TAIL]   # the C path moved them
        kind = type(data)
        if kind is not bytes and kind is not bytearray:
            data = memoryview(data)
            if data.ndim != 1 or data.format != "B":
                data = data.cast("B")
        n = len(data)
        need = (n + 31) & ~15
        head = self._head
        if head is None:
            head = self._start_writer()
        cap = self.capacity
        at = head % cap
        if at + need > cap or head + need - self._peer_tail > cap:
            head, at = self._make_room(n, need, timeout)
        pos = _DATA + at
        self._mm[pos + _REC:pos + _REC + n] = data
        self._publish(pos, head, n, need)

    def put_from(self, nbytes: int, fill, timeout: float | None = None) -> None:
        """Append an `nbytes` record written in place by `fill(memoryview)` (no intermediate copy),
        e.g. `ring.put_from(codec.encoded_size(s), lambda mv: codec.encode_into(s, mv))`. fill must
        not use the view after it returns; if fill raises, nothing is committed."""
        head = self._head
        if head is None:
            head = self._start_writer()
        need = (nbytes + 31) & ~15
        head, at = self._make_room(nbytes, need, timeout)
        pos = _DATA + at
        view = self._mv[pos + _REC:pos + _REC + nbytes]
        try:
            fill(view)
        finally:
            try:
                view.release()
            except BufferError:                           # fill kept an array over it; GC frees it
                pass
        self._publish(pos, head, nbytes, need)

    def _publish(self, pos: int, head: int, n: int, need: int) -> None:
        """Commit: record header, then head (published last), fence, wake the reader if asleep."""
        q = self._q
        q[pos >> 3] = head
        q[(pos >> 3) + 1] = n | (((head >> 4) ^ n ^ _MIX) & _M32) << 32
        self._head = head + need
        q[_HEAD] = head + need
        _acq()
        _rel()
        t = q[_R_WAIT]
        if t and t != self._posted_r:
            self._posted_r = t
            self._sem_data.release()

    def _make_room(self, n: int, need: int, timeout) -> tuple[int, int]:
        """Slow path: wrap if the record does not fit before the end, wait for space; (head, at)."""
        if self._core is not None:                        # the C path moves head without us
            self._head, self._peer_tail = self._q[_HEAD], self._q[_TAIL]
        cap, head = self.capacity, self._head
        at = head % cap
        if at + need > cap:
            if need > cap or n >= _WRAP:
                raise ValueError(f"record of {n} bytes can never fit in ring {self.name} "
                                 f"(capacity {cap}, at most {cap - _REC} bytes per record)")
            t0 = _now()
            if head + cap - at - self._peer_tail > cap:
                self._wait_space(head - at, timeout)
            self._publish(_DATA + at, head, _WRAP, cap - at)   # wrap marker, own commit
            head, at = self._head, 0
            if timeout is not None:
                timeout = max(0.0, timeout - (_now() - t0))
        if head + need - self._peer_tail > cap:
            self._peer_tail = self._q[_TAIL]
            if head + need - self._peer_tail > cap:
                self._wait_space(head + need - cap, timeout)
        return head, at

    def _start_writer(self) -> int:
        q = self._q
        self._head = q[_HEAD]
        self._peer_tail = q[_TAIL]
        q[_W_PID] = os.getpid()
        return self._head

    def _wait_space(self, min_tail: int, timeout) -> None:
        """Block until the reader's tail reaches `min_tail`."""
        self._peer_tail = self._wait(_TAIL, lambda t: t >= min_tail, _W_WAIT, self._sem_space,
                                     timeout, "space")

    # ---- reader ----------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> bytes:
        """Next record as bytes; TimeoutError if none arrives within `timeout` s (None = forever)."""
        core = self._core
        if core is not None:
            if self._tail is None:
                self._start_reader()
            data = core.get(self.spin_s if timeout is None or timeout > self.spin_s else timeout)
            if data is not None:
                return data
            self._tail, self._peer_head = self._q[_TAIL], self._q[_HEAD]   # the C path moved them
        tail = self._tail
        if tail is None:
            tail = self._start_reader()
        q = self._q
        head = self._peer_head
        if head == tail:
            head = q[_HEAD]
            if head == tail:
                head = self._wait(_HEAD, lambda h: h != tail, _R_WAIT, self._sem_data, timeout, "data")
            self._peer_head = head
        cap = self.capacity
        at = tail % cap
        i = (_DATA + at) >> 3
        word = q[i + 1]
        n = word & _M32
        if q[i] != tail or word >> 32 != ((tail >> 4) ^ n ^ _MIX) & _M32:
            raise CorruptRecord(f"ring {self.name}: bad record header at {tail} (pos {q[i]}, word {word:#x})")
        if n == _WRAP:
            self._release(tail + cap - at)
            return self.get(timeout)
        end = tail + ((n + 31) & ~15)
        if end > head or at + _REC + n > cap:
            raise CorruptRecord(f"ring {self.name}: record at {tail} of {n} bytes overruns "
                                f"head {head} / capacity {cap}")
        pos = _DATA + at + _REC
        data = self._mm[pos:pos + n]
        self._release(end)                                # tail published after the copy
        return data

    def _release(self, tail: int) -> None:
        """Publish the new tail, fence (tail store before ticket load), wake a sleeping writer."""
        q = self._q
        self._tail = tail
        q[_TAIL] = tail
        _acq()
        _rel()
        t = q[_W_WAIT]
        if t and t != self._posted_w:
            self._posted_w = t
            self._sem_space.release()

    def _start_reader(self) -> int:
        q = self._q
        self._tail = q[_TAIL]
        self._peer_head = q[_HEAD]
        q[_R_PID] = os.getpid()
        return self._tail

    # ---- waiting ---------------------------------------------------------------------------
    def _wait(self, idx: int, ready, flag: int, sem, timeout, what: str) -> int:
        """Spin, then sleep on `sem`, until ready(q[idx]); return that value or raise TimeoutError."""
        q = self._q
        v = q[idx]
        if ready(v):
            return v
        start = _now()
        if timeout is not None and timeout <= 0:
            raise TimeoutError(f"ring {self.name}: no {what}")
        spin_end = start + self.spin_s
        hot_end = start + min(self.spin_s, _HOT_SPIN)
        while True:
            v = q[idx]
            if ready(v):
                return v
            t = _now()
            if t >= spin_end:
                break
            if t >= hot_end:                              # let a peer queued on this CPU run
                _yield()
        deadline = None if timeout is None else start + timeout
        while True:
            self._ticket += 1
            q[flag] = self._ticket                        # announce: I am going to sleep
            _acq()
            _rel()                                        # fence: ticket store before index load
            v = q[idx]
            if ready(v):
                q[flag] = 0
                return v
            wait = _SLICE
            if deadline is not None:
                wait = min(wait, deadline - _now())
                if wait <= 0:
                    q[flag] = 0
                    raise TimeoutError(f"ring {self.name}: no {what} within {timeout}s")
            self.sleeps += 1
            try:
                sem.acquire(wait)
                woken = True
            except (posix_ipc.BusyError, posix_ipc.SignalError):
                woken = False
            q[flag] = 0
            v = q[idx]
            if ready(v):
                if not woken:                             # ready but nobody posted: a missed wakeup
                    self.late_wakeups += 1                # (or a peer that stalled ~a whole slice)
                return v

    # ---- inspection ------------------------------------------------------------------------
    def stats(self, max_records: int = 100_000) -> dict:
        """capacity, used_bytes (head - tail) and records between tail and head (a racy snapshot:
        counted by walking record headers, up to max_records; -1 if the walk met an overwritten one);
        sleeps / late_wakeups: semaphore waits of this object, and those that ended by timeout."""
        q, cap = self._q, self.capacity
        tail, head = q[_TAIL], q[_HEAD]
        pos, records = tail, 0
        while pos < head and records < max_records:
            i = (_DATA + pos % cap) >> 3
            word = q[i + 1]
            if q[i] != pos:
                records = -1
                break
            if word & _M32 == _WRAP:
                pos += cap - pos % cap
            else:
                pos += ((word & _M32) + 31) & ~15
                records += 1
        return {"capacity": cap, "used_bytes": head - tail, "records": records,
                "sleeps": self.sleeps, "late_wakeups": self.late_wakeups}

    def positions(self) -> tuple[int, int]:
        """(head, tail) byte counters as published in shared memory."""
        return self._q[_HEAD], self._q[_TAIL]

    def writer_pid(self) -> int:
        return self._q[_W_PID]

    def reader_pid(self) -> int:
        return self._q[_R_PID]

    def peer_alive(self) -> bool:
        """False once the process on the other side is known dead (its pid, or the owner's if the
        peer has not registered yet). True while alive or unknown."""
        q, me = self._q, os.getpid()
        pid = q[_R_PID] if self._head is not None else q[_W_PID] if self._tail is not None else 0
        if not pid or pid == me:
            pid = self._seg.owner_pid
        return pid == me or pid_alive(pid)
