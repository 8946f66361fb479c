"""shm.ring.Ring: records round-trip (incl. wrap), cross-process integrity, timeouts, size limits,
and a writer killed mid-record never yields wrong bytes."""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import zlib

import pytest

from shm.ring import CorruptRecord, Ring
from tests.segments import test_segment

CTX = mp.get_context("spawn")


@pytest.fixture(autouse=True, params=["c", "python"])
def path(request, monkeypatch):
    """Every ring test runs twice: with the C fast path (when built) and on pure Python."""
    import shm.ring
    if request.param == "c" and shm.ring._Core is None:
        pytest.skip("C fast path not built")
    if request.param == "python":
        monkeypatch.setattr(shm.ring, "_Core", None)
    return request.param


@pytest.fixture
def pair():
    name = test_segment("ring")
    owner = Ring.create(name, 8192)
    peer = Ring.attach(name, timeout=5)
    yield owner, peer
    peer.close()
    owner.close()
    owner.unlink()


def _record(i: int, rng: random.Random, max_size: int) -> bytes:
    body = rng.randbytes(rng.randrange(max_size))
    return i.to_bytes(8, "little") + body + zlib.crc32(body).to_bytes(4, "little")


def test_roundtrip_random_sizes_with_wrap(pair):
    writer, reader = pair
    rng = random.Random(1)
    sent, got = [], []
    for i in range(4000):
        rec = rng.randbytes(rng.choice([0, 1, 15, 16, 17, rng.randrange(3000)]))
        try:
            writer.put(rec, timeout=0)
        except TimeoutError:                       # full: drain, then it must fit
            while len(got) < len(sent):
                got.append(reader.get(timeout=0))
            writer.put(rec, timeout=0)
        sent.append(rec)
        if rng.random() < 0.3:
            while len(got) < len(sent):
                got.append(reader.get(timeout=0))
    while len(got) < len(sent):
        got.append(reader.get(timeout=0))
    assert got == sent
    st = writer.stats()
    assert st["records"] == 0 and st["used_bytes"] == 0
    assert writer.positions()[0] > 50 * writer.capacity    # many laps, so many wrap markers


def test_bytes_like_inputs_and_put_from(pair):
    import numpy as np
    writer, reader = pair
    arr = np.arange(10, dtype=np.float32)
    writer.put(arr)
    writer.put(memoryview(b"abc"))
    writer.put(bytearray(b"xyz"))
    writer.put_from(5, lambda mv: mv.__setitem__(slice(None), b"hello"))
    assert reader.get(0) == arr.tobytes()
    assert [reader.get(0) for _ in range(3)] == [b"abc", b"xyz", b"hello"]


def test_timeouts_raise(pair):
    writer, reader = pair
    with pytest.raises(TimeoutError):
        reader.get(timeout=0)
    with pytest.raises(TimeoutError):
        reader.get(timeout=0.02)                  # spins, then sleeps on the semaphore
    writer.put(b"x" * 4000, timeout=0)
    with pytest.raises(TimeoutError):
        writer.put(b"y" * 4200, timeout=0.02)
    assert reader.get(timeout=1) == b"x" * 4000


def test_record_larger_than_capacity_raises(pair):
    writer, _ = pair
    with pytest.raises(ValueError):
        writer.put(b"z" * (writer.capacity + 1))
    with pytest.raises(ValueError):
        writer.put(b"z" * (writer.capacity - 15))  # + 16-byte record header does not fit


def test_only_owner_unlinks(pair):
    _, peer = pair
    with pytest.raises(RuntimeError):
        peer.unlink()


def _writer_child(name: str, n: int, seed: int, max_size: int) -> None:
    ring = Ring.attach(name, timeout=10)
    rng = random.Random(seed)
    for i in range(n):
        ring.put(_record(i, rng, max_size), timeout=10)
    ring.close()


def test_cross_process_records_with_checksums():
    name = test_segment("ring")
    ring = Ring.create(name, 1 << 18)
    try:
        n, seed, max_size = 3000, 7, 40000
        proc = CTX.Process(target=_writer_child, args=(name, n, seed, max_size))
        proc.start()
        got = [ring.get(timeout=20) for _ in range(n)]   # a fast reader waits at the head
        proc.join(10)
        assert proc.exitcode == 0
        with pytest.raises(TimeoutError):
            ring.get(timeout=0.01)
        rng = random.Random(seed)
        for i, rec in enumerate(got):
            assert int.from_bytes(rec[:8], "little") == i
            assert zlib.crc32(rec[8:-4]) == int.from_bytes(rec[-4:], "little")
            assert rec == _record(i, rng, max_size)
    finally:
        ring.close()
        ring.unlink()


def _die_mid_record(name: str, complete: int) -> None:
    ring = Ring.attach(name, timeout=10)
    for i in range(complete):
        ring.put(bytes([i]) * 1000, timeout=10)

    def half_then_die(view: memoryview) -> None:
        view[: len(view) // 2] = b"\xee" * (len(view) // 2)
        os.kill(os.getpid(), signal.SIGKILL)

    ring.put_from(3000, half_then_die, timeout=10)


def test_writer_killed_mid_record_never_yields_wrong_bytes():
    name = test_segment("ring")
    ring = Ring.create(name, 1 << 14)
    try:
        proc = CTX.Process(target=_die_mid_record, args=(name, 5))
        proc.start()
        proc.join(20)
        assert proc.exitcode == -signal.SIGKILL
        for i in range(5):
            assert ring.get(timeout=5) == bytes([i]) * 1000
        with pytest.raises(TimeoutError):         # the torn record is invisible
            ring.get(timeout=0.01)
        assert not ring.peer_alive()
        # a new writer takes over where the dead one committed; the reader sees only its records
        writer = Ring.attach(name)
        writer.put(b"after", timeout=1)
        assert ring.get(timeout=1) == b"after"
        writer.close()
    finally:
        ring.close()
        ring.unlink()


def test_uncommitted_record_is_invisible_and_inconsistent_records_raise(pair):
    writer, reader = pair
    writer.put(b"ok", timeout=0)
    # payload + header written, head not published (writer died just before publishing)
    head, at = writer._make_room(4, 48, 0)
    pos = 256 + at
    writer._mm[pos + 16:pos + 20] = b"torn"
    writer._q[pos >> 3], writer._q[(pos >> 3) + 1] = head, 4
    assert reader.get(timeout=0) == b"ok"
    with pytest.raises(TimeoutError):
        reader.get(timeout=0)
    # head published over a header that does not match (lost/reordered header write)
    writer._q[8] = writer._head + 32
    with pytest.raises(CorruptRecord, match="bad record header"):
        reader.get(timeout=0)


def test_corrupt_length_or_flipped_header_raise(pair):
    writer, reader = pair
    writer.put(b"a" * 100, timeout=0)
    i = (256 + reader._q[16] % reader.capacity) >> 3
    good = reader._q[i + 1]
    reader._q[i + 1] = good ^ (1 << 3)             # bit flip in the length
    with pytest.raises(CorruptRecord):
        reader.get(timeout=0)
    reader._q[i + 1] = good
    reader._q[i] ^= 1 << 40                        # bit flip in the position
    with pytest.raises(CorruptRecord):
        reader.get(timeout=0)
    reader._q[i] ^= 1 << 40
    assert reader.get(timeout=0) == b"a" * 100


def _echo_child(down: str, up: str, n: int) -> None:
    a, b = Ring.attach(down, spin_us=0), Ring.attach(up, spin_us=0)
    for _ in range(n):
        b.put(a.get(timeout=20), timeout=20)
    a.close()
    b.close()


def test_sleeping_waits_are_woken_by_the_peer():
    """spin_us=0: every wait goes through announce -> fence -> re-check -> semaphore; records must
    all arrive, and waits must end by the peer's post, not by the slice timeout."""
    down, up = test_segment("down"), test_segment("up")
    a, b = Ring.create(down, 4096, spin_us=0), Ring.create(up, 4096, spin_us=0)
    try:
        n = 1500
        proc = CTX.Process(target=_echo_child, args=(down, up, n))
        proc.start()
        rng = random.Random(3)
        for i in range(n):
            rec = _record(i, rng, 3000)
            a.put(rec, timeout=20)
            assert b.get(timeout=20) == rec
        proc.join(10)
        assert proc.exitcode == 0
        st = b.stats()
        assert st["sleeps"] > n // 10 and st["late_wakeups"] * 10 <= n, st
    finally:
        for r in (a, b):
            r.close()
            r.unlink()


def test_put_from_with_codec_encode_into(pair):
    from shm import codec
    writer, reader = pair
    s = codec.Sequences.build(1, 5, 2, [dict(prompt=[1, 2], completion=[3], logprobs=[-1.0], reward=1.0)])
    writer.put_from(codec.encoded_size(s), lambda mv: codec.encode_into(s, mv), timeout=0)
    assert codec.decode(reader.get(timeout=0)) == s
