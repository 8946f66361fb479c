"""`ray_weights` (issue #27 item 3): weights to a host on another node over a real gloo pair of two
real processes (no Ray). Bytes arrive exactly, bucketed, whatever the size; a slot the trainer
rewrites mid-send is sent again (the receiver publishes one whole version, never a mix); a slot
damaged past its seqlock mid-send (its CRC-32s were taken before) raises and publishes nothing; a
peer that dies mid-transfer makes the other side raise within the pair's timeout.

Each test acts at a point of the transfer it reaches for sure, whatever the machine's load: the
receiver child is stopped (SIGSTOP) before the transfer starts, and gloo sends a message only once its
receiver has posted the receive, so the sender (this process) blocks in `_send_ints` (the version's
head or its CRC-32s, taken before) and no bucket leaves it; the test waits until the sending thread
is there (its stack), then damages, rewrites or kills, and lets the receiver go on. Where the child
sends, the test kills it once bucket 0 has landed and tries again in the rare case the whole transfer
beat the kill."""
from __future__ import annotations

import contextlib
import mmap
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from orchestrator.runtime.ray_weights import Rendezvous, join  # noqa: E402
from shm.segments import SHM_DIR  # noqa: E402
from shm.weights import WeightBuffer  # noqa: E402
from tests.segments import test_segment  # noqa: E402

CTX = mp.get_context("spawn")
TIMEOUT_S = 10.0
BUCKET = 4 << 10           # small buckets: a transfer is many round trips, so a long one is slow
WAIT_S = 60.0              # a child's start (its torch import) on a loaded machine
LONG = 4096                # buckets of the transfer a dying sender child is killed in once bucket 0
                           # has landed (16 MB, ~0.5 s: its last bucket is far off then)
FEW = 16                   # buckets of the transfers the receiver child is stopped before


def _content(version: int, nbytes: int) -> np.ndarray:
    """Every 8-byte word differs and depends on the version (a mix of two is visible)."""
    words = -(-nbytes // 8)
    return (np.arange(words, dtype=np.int64) * 1_000_003 + version * 7_919 + 1).view(np.uint8)[:nbytes]


def _peer(role: str, port: int, key: str, buf: str, count: int, q) -> None:
    """A child: the receiver of `count` versions into weight buffer `buf`, or the sender of its
    latest version; each outcome goes to q."""
    wbuf = WeightBuffer.attach(buf)
    try:
        pair = join("127.0.0.1", port, key, "127.0.0.1", TIMEOUT_S)
        q.put(("joined", os.getpid()))
        for _ in range(count):
            try:
                got = (pair.recv_into(wbuf) if role == "recv"
                       else pair.send_latest(wbuf, 1, BUCKET))
                q.put(("ok", got))
            except Exception as exc:
                q.put(("error", type(exc).__name__, str(exc)))
                break
        pair.close()
    finally:
        wbuf.close()


class Pair:
    """This process's side (rank 0 of the pair) and a child on the other side."""

    def __init__(self, child_role: str, buf: str, count: int = 1) -> None:
        self.rdv = Rendezvous("127.0.0.1", WAIT_S)             # the child imports torch first
        key = uuid.uuid4().hex[:8]
        self.q = CTX.Queue()
        self.proc = CTX.Process(target=_peer, args=(child_role, self.rdv.port, key, buf, count, self.q))
        self.proc.start()
        self.pair = self.rdv.pair(key)
        self.pair.timeout_s = TIMEOUT_S
        assert self.q.get(timeout=WAIT_S)[0] == "joined"

    def close(self) -> None:
        self.pair.close()
        self.proc.join(TIMEOUT_S)
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join(TIMEOUT_S)


class Side(threading.Thread):
    """This process's side of a transfer in a thread (joined by the test), its outcome kept."""

    def __init__(self, fn) -> None:
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except Exception as exc:
            self.error = exc


@contextlib.contextmanager
def _transfer(nbytes: int, child: str = "recv", count: int = 1, publish: bool = True):
    """(src, dst, pair): two weight buffers (src holding version 1 when `publish`) and a Pair whose
    child receives into dst (`child` "recv") or sends from src ("send"); all closed after."""
    src = WeightBuffer.create(test_segment("weights"), nbytes)
    dst = WeightBuffer.create(test_segment("weights"), nbytes)
    p = None
    try:
        if publish:
            src.publish(_content(1, nbytes), 1)
        p = Pair(child, (dst if child == "recv" else src).name, count)
        yield src, dst, p
    finally:
        if p is not None:
            p.close()
        for b in (src, dst):
            b.close()
            b.unlink()


def _landed(dst: WeightBuffer, nbytes: int, value: int) -> None:
    """Wait (bounded) until bucket 0 of the version being received shows in dst's free slot."""
    view = dst.next_slot_view(nbytes)
    deadline = time.monotonic() + WAIT_S
    while view[BUCKET - 1] != value:
        assert time.monotonic() < deadline, "bucket 0 never arrived"
        time.sleep(0.0005)
    view.release()


def _stuck_in_head(sender: threading.Thread) -> None:
    """Wait (bounded) until `sender` is inside `_send_ints` called from `_send_view`: it took the
    version's CRC-32s and sends its head or the CRC-32s to a receiver that is stopped, so no bucket
    has left it (gloo sends only to a posted receive)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        frame, names = sys._current_frames().get(sender.ident), []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if "_send_ints" in names and "_send_view" in names:
            return
        assert sender.is_alive() and time.monotonic() < deadline, f"sender never blocked: {names}"
        time.sleep(0.001)


@contextlib.contextmanager
def _held_send(p: "Pair", src: WeightBuffer):
    """This process sends src's version 1 to the child, which is stopped first: yields the sending
    thread once it is stuck in the version's head (`_stuck_in_head`); the child goes on after."""
    send = Side(lambda: p.pair.send_latest(src, 1, BUCKET))
    os.kill(p.proc.pid, signal.SIGSTOP)
    try:
        send.start()
        _stuck_in_head(send)
        yield send
    finally:
        if p.proc.is_alive():
            os.kill(p.proc.pid, signal.SIGCONT)


def _writable_slot(wbuf: WeightBuffer) -> memoryview:
    """The published slot of wbuf, mapped writable: writes there bypass its seqlock."""
    where = []
    wbuf.read_shared(lambda slot, _v: where.append(slot))
    slot = where[0]
    fd = os.open(os.path.join(SHM_DIR, slot.name.lstrip("/")), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    return memoryview(mm)[slot.offset:slot.offset + slot.nbytes]


def _read(wbuf: WeightBuffer, nbytes: int) -> tuple:
    out = np.zeros(nbytes, np.uint8)
    return wbuf.read_into(out), out


def test_bytes_arrive_exactly_bucketed_whatever_the_size():
    sizes = [3 * BUCKET + 123, BUCKET, 1, 0]                  # not a multiple, one bucket, tiny, none
    with _transfer(max(sizes), count=len(sizes), publish=False) as (src, dst, p):
        for v, n in enumerate(sizes, start=1):
            src.publish(_content(v, n), v)
            assert p.pair.send_latest(src, v, BUCKET) == (v, n, -(-n // BUCKET))
            assert p.q.get(timeout=WAIT_S) == ("ok", v)
            got, out = _read(dst, n)
            assert got == v and np.array_equal(out, _content(v, n))


def test_a_slot_rewritten_mid_send_is_sent_again_never_mixed():
    n = FEW * BUCKET
    with _transfer(n) as (src, dst, p):
        with _held_send(p, src) as send:
            src.publish(_content(2, n), 2)
            src.publish(_content(3, n), 3)                   # into the slot being sent
        send.join(WAIT_S)
        assert not send.is_alive() and send.error is None, send.error
        assert send.result == (3, n, FEW)
        assert p.q.get(timeout=WAIT_S) == ("ok", 3)
        got, out = _read(dst, n)
        assert got == 3 and np.array_equal(out, _content(3, n))


def test_a_slot_damaged_mid_send_raises_and_publishes_nothing():
    n = FEW * BUCKET
    with _transfer(n) as (src, dst, p):
        slot = _writable_slot(src)
        try:
            with _held_send(p, src) as send:
                slot[n - 1] ^= 0xFF                          # the last bucket, past the seqlock
            send.join(WAIT_S)
            assert not send.is_alive() and send.error is None, send.error
            kind, name, msg = p.q.get(timeout=WAIT_S)
            assert (kind, name) == ("error", "ChannelError"), msg
            assert f"bucket {FEW - 1} of {FEW}" in msg and "CRC-32" in msg, msg
            assert dst.latest_version() == -1               # nothing published
        finally:
            slot.release()


def test_a_receiver_that_dies_mid_transfer_makes_the_sender_raise():
    n = FEW * BUCKET
    with _transfer(n) as (src, dst, p):
        with _held_send(p, src) as send:
            os.kill(p.proc.pid, signal.SIGKILL)
            p.proc.join(WAIT_S)
        send.join(TIMEOUT_S + 5)                             # the pair's timeout bounds it
        assert not send.is_alive(), "the sender still waits on its dead receiver"
        assert send.error is not None and send.result is None
        assert dst.latest_version() == -1


def test_a_sender_that_dies_mid_transfer_makes_the_receiver_raise():
    n = LONG * BUCKET
    for _ in range(3):                       # a try whose whole transfer beat the kill proves nothing
        with _transfer(n, "send") as (src, dst, p):
            here = Side(lambda: p.pair.recv_into(dst))
            here.start()
            _landed(dst, n, _content(1, n)[BUCKET - 1])
            os.kill(p.proc.pid, signal.SIGKILL)
            here.join(TIMEOUT_S + 5)                         # the pair's timeout bounds it
            assert not here.is_alive(), "the receiver still waits on its dead sender"
            if here.result is not None:
                continue
            assert here.error is not None and dst.latest_version() == -1
            return
    pytest.fail("the sender child finished 3 transfers of 16 MB before a kill landed")
