"""shm.segments: naming, and sweep_dead removes segments and semaphores of dead owners (SIGKILLed
process, reused pid, orphan semaphore, headerless leftovers) while keeping live ones."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import uuid

import posix_ipc
import pytest

from shm import segments
from shm.counter import SharedCounter
from shm.ring import Ring
from shm.segments import HEADER, SHM_DIR, Segment, segment_name, sem_name, sweep_dead
from shm.weights import WeightBuffer

CTX = mp.get_context("spawn")


def _run_id() -> str:
    return "t" + uuid.uuid4().hex[:12]


def _exists(name: str, semaphore: bool = False) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, ("sem." if semaphore else "") + name.lstrip("/")))


def test_segment_name():
    assert segment_name("run1", "out_inference0") == "/arl_run1_out_inference0"
    assert sem_name("/arl_run1_x", "data") == "/arl_run1_x.data"
    for bad in ("", "a/b", "a.b", "a b", None):
        with pytest.raises(ValueError):
            segment_name(bad, "role")
        with pytest.raises(ValueError):
            segment_name("run", bad)
    with pytest.raises(ValueError):
        segment_name("r" * 300, "x")


def _create_and_hang(run_id: str, ready) -> None:
    Ring.create(segment_name(run_id, "ring"), 4096)
    SharedCounter.create(segment_name(run_id, "version"))
    WeightBuffer.create(segment_name(run_id, "weights"), 1 << 16)
    ready.set()
    signal.pause()


def test_sweep_removes_dead_owner_and_keeps_live():
    run_id = _run_id()
    ready = CTX.Event()
    proc = CTX.Process(target=_create_and_hang, args=(run_id, ready), daemon=True)
    proc.start()
    assert ready.wait(20)
    live = SharedCounter.create(segment_name(run_id, "live"))
    try:
        dead = [segment_name(run_id, r) for r in ("ring", "version", "weights")]
        assert sweep_dead(prefix=f"arl_{run_id}") == []           # owner still alive: untouched
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        removed = sweep_dead(prefix=f"arl_{run_id}")
        ring = dead[0]
        assert sorted(removed) == sorted(dead + [sem_name(ring, "data"), sem_name(ring, "space")])
        assert not any(_exists(n) for n in dead)
        assert not _exists(sem_name(ring, "data"), semaphore=True)
        assert _exists(live.name) and live.get() == 0
    finally:
        live.close()
        live.unlink()


def test_sweep_guards_against_pid_reuse():
    name = segment_name(_run_id(), "reused")
    seg = Segment.create(name, 64)
    magic, ver, kind, pid, ctime, payload = HEADER.unpack_from(seg.mm, 0)
    assert pid == os.getpid()
    HEADER.pack_into(seg.mm, 0, magic, ver, kind, pid, ctime - 1000.0, payload)  # same pid, older process
    seg.close()
    assert sweep_dead(prefix=name[1:]) == [name]


def test_sweep_orphan_semaphore_and_headerless_segment():
    run_id = _run_id()
    orphan = sem_name(segment_name(run_id, "gone"), "data")
    posix_ipc.Semaphore(orphan, posix_ipc.O_CREX).close()
    raw = segment_name(run_id, "raw")                          # creator died before writing a header
    posix_ipc.SharedMemory(raw, posix_ipc.O_CREX, size=4096).close_fd()
    assert sweep_dead(prefix=f"arl_{run_id}") == [orphan]       # headerless but young: kept
    assert sweep_dead(prefix=f"arl_{run_id}", grace_s=0.0) == [raw]
    with pytest.raises(ValueError):
        sweep_dead(prefix="other_")


def test_create_refuses_existing_and_attach_checks_kind():
    name = segment_name(_run_id(), "dup")
    c = SharedCounter.create(name)
    try:
        with pytest.raises(FileExistsError):
            SharedCounter.create(name)
        with pytest.raises(RuntimeError, match="kind"):
            Ring.attach(name, timeout=1)
        assert segments.entry_owner(name[1:])[0] == os.getpid()
    finally:
        c.close()
        c.unlink()
