"""shm.weights.WeightBuffer and shm.counter.SharedCounter: publish/read, limits, and a concurrent
writer process never lets a reader see a torn snapshot (content is derived from the version)."""
from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from shm.counter import SharedCounter
from shm.weights import WeightBuffer
from tests.segments import test_segment

CTX = mp.get_context("spawn")


def _content(version: int, nbytes: int) -> np.ndarray:
    """Every 8-byte word differs and depends on the version: any mix of two versions is visible."""
    return (np.arange(nbytes // 8, dtype=np.int64) * 1_000_003 + version * 7_919).view(np.uint8)


def _version_of(buf: np.ndarray) -> int:
    return int(buf[:8].view(np.int64)[0]) // 7_919


def test_publish_read_basics():
    name = test_segment("weights")
    with WeightBuffer.create(name, 1000) as w, WeightBuffer.attach(name) as r:
        assert r.latest_version() == -1
        with pytest.raises(TimeoutError):
            r.read_into(bytearray(1000), timeout=0.01)
        w.publish(b"a" * 1000, 0)
        w.publish_from(lambda mv: mv.__setitem__(slice(None), b"b" * 600), 600, 1)
        out = bytearray(1000)
        assert r.latest_version() == 1 and r.read_into(out) == 1
        assert out[:600] == b"b" * 600 and out[600:] == bytes(400)
        w.publish(np.full(250, 3, np.int32), 2)      # any bytes-like, any dtype
        assert r.read_into(memoryview(out)) == 2 and np.frombuffer(out, np.int32).tolist() == [3] * 250
        with pytest.raises(ValueError):
            w.publish(b"x" * 1001, 3)
        with pytest.raises(ValueError):
            r.read_into(bytearray(10))
        with pytest.raises(TimeoutError):
            r.read_into(out, timeout=0.01, min_version=3)
        seen = []
        assert r.read_with(lambda mv, v: seen.append((bytes(mv[:4]), v))) == 2 and seen == [(b"\x03\x00\x00\x00", 2)]


def _publisher(name: str, versions: int, nbytes: int) -> None:
    w = WeightBuffer.attach(name)
    for v in range(versions):
        w.publish(_content(v, nbytes), v)
    w.close()


def test_concurrent_publisher_never_yields_torn_snapshot():
    name, nbytes, versions = test_segment("weights"), (9 << 20) + 24, 200   # > 2 publish chunks
    w = WeightBuffer.create(name, nbytes)
    try:
        proc = CTX.Process(target=_publisher, args=(name, versions, nbytes))
        proc.start()
        out = np.zeros(nbytes, np.uint8)
        words = out.view(np.int64)
        stride = 4099                                # sampled check: cheap, so reads overlap publishes
        expect = np.arange(0, len(words), stride, dtype=np.int64) * 1_000_003
        reads, last = 0, -1
        while last < versions - 1:
            # mostly plain latest-snapshot reads; every 4th streams a version not yet finished
            min_version = last + 1 if reads % 4 == 3 else 0
            v = w.read_into(out, timeout=30, min_version=min_version)
            assert v >= last and v >= min_version
            assert np.array_equal(words[::stride], expect + v * 7_919), f"torn snapshot of version {v}"
            if reads % 16 == 0:
                assert np.array_equal(out, _content(v, nbytes)), f"torn snapshot of version {v}"
            reads += 1
            last = v
        proc.join(20)
        assert proc.exitcode == 0 and reads > 2
    finally:
        w.close()
        w.unlink()


@pytest.mark.parametrize("shared", [False, True], ids=["read_with", "read_shared"])
def test_read_with_retries_a_check_that_failed_on_a_rewritten_slot(shared):
    """fn raises on content that is not all its version (as the sim backend checks): with a
    publisher rewriting both slots under a slow reader, fn sees torn slots and raises, yet
    read_with only ever returns a version fn accepted, and a failure on a stable slot propagates.
    read_shared: the same, fn reading through its own mapping of the segment by name (as vLLM's
    tensor-parallel ranks do in their processes)."""
    name, nbytes, versions = test_segment("weights"), 1 << 20, 400
    w = WeightBuffer.create(name, nbytes)
    maps: dict = {}
    try:
        proc = CTX.Process(target=_publisher, args=(name, versions, nbytes))
        proc.start()
        torn, accepted = [0], []

        def check(view, version):
            if shared:
                assert view.name == name and view.nbytes == nbytes
                view = view.view(maps)
            got = np.frombuffer(view, np.uint8)
            first = got[:8].copy()
            time.sleep(0.002)                         # a slow check: publishes overlap it
            if not np.array_equal(got[-8:], _content(version, nbytes)[-8:]) or \
                    not np.array_equal(first, _content(version, nbytes)[:8]):
                torn[0] += 1
                raise ValueError(f"torn version {version}")
            accepted.append(version)

        read = w.read_shared if shared else w.read_with
        last = -1
        while last < versions - 1:
            v = read(check, timeout=30, min_version=last + 1 if last > versions // 2 else 0)
            assert v == accepted[-1] and v >= last
            last = v
        proc.join(20)
        assert proc.exitcode == 0
        assert torn[0] > 0                            # the publisher really overlapped the checks
        with pytest.raises(ValueError, match="torn version"):     # a stable slot: fn's error
            read(lambda view, version: check(view, version + 1), timeout=1)
    finally:
        w.close()
        w.unlink()


def test_shared_counter():
    name = test_segment("version")
    c = SharedCounter.create(name, initial=3)
    r = SharedCounter.attach(name)
    assert r.get() == 3
    c.set(-1)
    assert r.get() == -1
    c.set(2**62)
    assert r.get() == 2**62
    with pytest.raises(RuntimeError):
        r.unlink()
    r.close()
    c.close()
    c.unlink()
    with pytest.raises(TimeoutError):
        SharedCounter.attach(name, timeout=0.01)


def test_failed_publish_leaves_previous_version():
    name = test_segment("weights")
    with WeightBuffer.create(name, 64) as w:
        w.publish(b"a" * 64, 1)

        def boom(mv):
            mv[:8] = b"x" * 8
            raise RuntimeError("trainer failed mid-copy")

        with pytest.raises(RuntimeError):
            w.publish_from(boom, 64, 2)
        out = bytearray(64)
        assert w.latest_version() == 1 and w.read_into(out) == 1 and out == b"a" * 64
        with pytest.raises(TimeoutError):
            w.read_into(out, timeout=0.01, min_version=2)
        w.publish(b"c" * 64, 2)
        assert w.read_into(out, min_version=2) == 2 and out == b"c" * 64
