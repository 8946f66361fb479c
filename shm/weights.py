"""WeightBuffer: CPU POSIX-shm double buffer for trainer -> inference weight hand-off.

Contract: `WeightBuffer.create(name, nbytes)` (owner), `.attach(name, timeout=10)`. One writer:
`publish(data, version)` copies bytes-like `data` (len <= nbytes) into the slot that is not current,
then switches the current word to (version, slot) with one aligned 8-byte store;
`publish_from(writer_fn, nbytes, version)` lets `writer_fn(memoryview)` fill the slot in place;
`next_slot_view(nbytes)` lets helpers of that writer fill parts of it while writer_fn runs.
Any number of readers: `latest_version()` (-1 before the first publish); `read_into(out,
timeout=10.0, min_version=0) -> version` copies a consistent snapshot of the latest version
(>= min_version) into the writable buffer `out`; `read_with(fn, ...)` calls `fn(view, version)` with
a read-only view of the slot instead (fn may run more than once: it must only copy; an exception
from fn on a slot that was rewritten meanwhile counts as a torn read and is retried, one on a
stable slot propagates); `read_shared(fn, ...)` is `read_with` for readers in other processes: fn
gets a `SharedSlot` (segment name, offset, length; `.view(maps)` maps it read-only) and the same
check covers what they read while fn ran. Never a torn copy: each slot has a seqlock (odd while
written); a reader retries when the sequence moved during its copy, so a reader slower than two
publishes retries until the deadline and then raises TimeoutError.
Streaming: when `read_into` asks for a version newer than the latest and `publish` is writing it
right now, the reader copies behind the writer chunk by chunk (publish reports progress every 4 MB)
and re-checks that slot's sequence after every chunk, so a hand-off costs about one copy, not two.
`close()`, `unlink()` (owner only). No GPU path here (CUDA IPC handles live elsewhere).
`WeightBuffer.shm_bytes(nbytes)`: the /dev/shm bytes a buffer created with `nbytes` takes.
"""
from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass

from shm.segments import HEADER_SIZE, KIND_WEIGHTS, PAGE, SHM_DIR, Mapped, Segment

_CUR = 8                                   # int64 index: (version << 1) | slot, -1 = none yet
_NBYTES = 9                                # slot capacity in bytes
_META = (16, 24)                           # int64 index of each slot's line (fields below)
_SEQ, _VER, _LEN, _PROG, _WVER = 0, 1, 2, 3, 4    # seqlock, version, length, progress, version being written
_CHUNK = 4 << 20                           # publish() copies in chunks and reports progress
_DATA = 4096                               # slot 0 data offset; slots are page aligned


def _bytes_view(buf, writable: bool = False) -> memoryview:
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    if writable and mv.readonly:
        raise ValueError("buffer must be writable")
    return mv


def _release(view: memoryview) -> None:
    try:
        view.release()
    except BufferError:                    # a callback kept an array over it; GC releases it later
        pass


@dataclass(frozen=True)
class SharedSlot:
    """Where a snapshot lies in a weight buffer's segment (`<SHM_DIR>/<name>`, bytes [offset,
    offset + nbytes)): what `read_shared` hands out, small enough to send to another process."""
    name: str
    offset: int
    nbytes: int

    def view(self, maps: dict) -> memoryview:
        """A read-only view of those bytes in this process, the segment mapped once (in `maps`)."""
        mm = maps.get(self.name)
        if mm is None:
            fd = os.open(os.path.join(SHM_DIR, self.name.lstrip("/")), os.O_RDONLY)
            try:
                mm = maps[self.name] = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        return memoryview(mm)[self.offset:self.offset + self.nbytes]


class WeightBuffer(Mapped):
    def __init__(self, seg: Segment):
        self._seg, self.name = seg, seg.name
        self._mv = memoryview(seg.mm)
        self._q = self._mv.cast("q")
        self.nbytes = self._q[_NBYTES]
        self._stride = (self.nbytes + PAGE - 1) // PAGE * PAGE

    @staticmethod
    def shm_bytes(nbytes: int) -> int:
        """/dev/shm bytes of a buffer created with `nbytes`: header page + two page-aligned slots."""
        return _DATA + 2 * ((nbytes + PAGE - 1) // PAGE * PAGE)

    @classmethod
    def create(cls, name: str, nbytes: int) -> "WeightBuffer":
        if nbytes < 1:
            raise ValueError(f"weight buffer needs nbytes >= 1, got {nbytes}")
        stride = (nbytes + PAGE - 1) // PAGE * PAGE

        def init(mm):
            mm[_CUR * 8:_CUR * 8 + 8] = (-1).to_bytes(8, "little", signed=True)
            mm[_NBYTES * 8:_NBYTES * 8 + 8] = nbytes.to_bytes(8, "little")

        return cls(Segment.create(name, _DATA - HEADER_SIZE + 2 * stride, KIND_WEIGHTS, init=init))

    @classmethod
    def attach(cls, name: str, timeout: float = 10.0) -> "WeightBuffer":
        return cls(Segment.attach(name, KIND_WEIGHTS, timeout))

    # ---- writer ----------------------------------------------------------------------------
    def publish(self, data, version: int) -> None:
        """Copy `data` into the free slot in chunks (a streaming reader follows along), then switch."""
        src = _bytes_view(data)

        def fill(dst: memoryview, progress) -> None:
            for a in range(0, len(src), _CHUNK):
                b = min(a + _CHUNK, len(src))
                dst[a:b] = src[a:b]
                progress(b)

        self._publish(fill, len(src), version)

    def publish_from(self, writer_fn, nbytes: int, version: int) -> None:
        """Let writer_fn fill a writable view of exactly `nbytes` bytes, then publish `version`."""
        self._publish(lambda dst, _progress: writer_fn(dst), nbytes, version)

    def _publish(self, fill, nbytes: int, version: int) -> None:
        if not 0 <= nbytes <= self.nbytes:
            raise ValueError(f"{nbytes} bytes do not fit weight buffer {self.name} ({self.nbytes})")
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        q = self._q
        cur = q[_CUR]
        slot = 0 if cur < 0 else 1 - (cur & 1)
        m = _META[slot]
        seq = q[m + _SEQ] & ~1
        q[m + _WVER] = -1
        q[m + _SEQ] = seq + 1                             # odd: being written
        q[m + _LEN] = nbytes
        q[m + _PROG] = 0
        q[m + _WVER] = version                            # streaming readers may follow from here
        off = _DATA + slot * self._stride
        view = self._mv[off:off + nbytes]
        try:
            fill(view, lambda done: q.__setitem__(m + _PROG, done))
        except BaseException:                             # end the episode as "no version here"
            q[m + _VER] = -1
            q[m + _WVER] = -1
            q[m + _SEQ] = seq + 2
            raise
        finally:
            _release(view)
        q[m + _PROG] = nbytes
        q[m + _VER] = version
        q[m + _SEQ] = seq + 2                             # even: stable
        q[_CUR] = (version << 1) | slot                   # switch

    def next_slot_view(self, nbytes: int) -> memoryview:
        """A writable view of the slot the next publish fills, for helpers of the one writer
        (other trainer ranks writing their shards): they write only while that publish has the
        slot marked as being written, and release the view after."""
        if not 0 <= nbytes <= self.nbytes:
            raise ValueError(f"{nbytes} bytes do not fit weight buffer {self.name} ({self.nbytes})")
        cur = self._q[_CUR]
        off = _DATA + (0 if cur < 0 else 1 - (cur & 1)) * self._stride
        return self._mv[off:off + nbytes]

    # ---- readers ---------------------------------------------------------------------------
    def latest_version(self) -> int:
        cur = self._q[_CUR]
        return -1 if cur < 0 else cur >> 1

    def read_into(self, out, timeout: float = 10.0, min_version: int = 0) -> int:
        """Copy the latest snapshot (version >= min_version) into `out` (writable, large enough) and
        return its version. If that version is still being published, copy behind the writer."""
        dst = _bytes_view(out, writable=True)

        def copy(src: memoryview, at: int = 0) -> None:
            if at + len(src) > len(dst):
                raise ValueError(f"output buffer of {len(dst)} bytes is too small for the weights")
            dst[at:at + len(src)] = src

        return self.read_with(lambda src, _version: copy(src), timeout, min_version, _stream=copy)

    def _follow(self, min_version: int, copy, deadline: float) -> int | None:
        """Stream a version >= min_version that is being written now; None if there is none or the
        writer moved on (the caller retries)."""
        q = self._q
        for slot in (0, 1):
            m = _META[slot]
            seq = q[m + _SEQ]
            version = q[m + _WVER]
            if not seq & 1 or version < min_version:
                continue
            n = q[m + _LEN]
            base = _DATA + slot * self._stride
            done, spins = 0, 0
            while True:
                prog = q[m + _PROG]
                now = q[m + _SEQ]
                if now == seq + 1:                        # finished: everything up to n is final
                    prog = n
                elif now != seq:
                    return None
                if prog > done:
                    copy(self._mv[base + done:base + prog].toreadonly(), done)
                    done = prog
                    if q[m + _SEQ] not in (seq, seq + 1):
                        return None                       # a later publish reused the slot
                if now == seq + 1:
                    return version if q[m + _VER] == version else None
                spins += 1
                if spins & 63 == 0 and time.monotonic() >= deadline:
                    return None
                os.sched_yield()                          # the writer may be queued on this CPU
        return None

    def read_with(self, fn, timeout: float = 10.0, min_version: int = 0, _stream=None) -> int:
        """Call fn(read-only view of the latest snapshot, its version); return that version once fn
        ran on a slot nobody overwrote meanwhile (fn may be called again)."""
        return self._read(fn, timeout, min_version, _stream, shared=False)

    def read_shared(self, fn, timeout: float = 10.0, min_version: int = 0) -> int:
        """`read_with`, but fn gets a `SharedSlot` (where the snapshot lies in this segment) for
        readers in other processes that map the segment by name while fn runs (vLLM's
        tensor-parallel workers); the slot's sequence, checked after fn, covers what they read."""
        return self._read(fn, timeout, min_version, None, shared=True)

    def _read(self, fn, timeout: float, min_version: int, _stream, shared: bool) -> int:
        q = self._q
        deadline = time.monotonic() + timeout
        pause = 0.0
        while True:
            cur = q[_CUR]
            if cur >= 0 and cur >> 1 >= min_version:
                slot, version = cur & 1, cur >> 1
                seq_i = _META[slot]
                seq = q[seq_i]
                if not seq & 1 and q[seq_i + _VER] == version:
                    n = q[seq_i + _LEN]
                    off = _DATA + slot * self._stride
                    view = (SharedSlot(self.name, off, n) if shared
                            else self._mv[off:off + n].toreadonly())
                    try:
                        fn(view, version)
                    except Exception:
                        if q[seq_i] == seq:               # fn failed on a stable slot: its error
                            raise
                    finally:                              # (else it read a torn slot: retry)
                        if not shared:
                            _release(view)
                    if q[seq_i] == seq:                   # nobody rewrote the slot meanwhile
                        return version
                    pause = 0.0
            elif _stream is not None:
                got = self._follow(min_version, _stream, deadline)
                if got is not None:
                    return got
            if time.monotonic() >= deadline:
                raise TimeoutError(f"weight buffer {self.name}: no consistent version >= {min_version} "
                                   f"within {timeout}s (latest {self.latest_version()})")
            if pause:
                time.sleep(pause)
            pause = min(max(pause * 2, 5e-5), 5e-4)

    # ---- lifecycle ----------------------------------------------------------------------
    def _views(self) -> tuple:
        return (self._q, self._mv)
