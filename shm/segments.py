"""Shared-memory naming, the common segment header, and the dead-owner sweeper.

Contract
- Names: a segment is `/arl_<run_id>_<role>` (`segment_name`); a semaphore that belongs to a segment
  is `<segment>.<suffix>` (`sem_name`) and shows in /dev/shm as `sem.arl_<run_id>_<role>.<suffix>`.
  run_id and role use only [A-Za-z0-9_-], so the first '.' of a semaphore name ends its segment name.
- Header: every segment starts with the same 64-byte header (little-endian): magic (8 bytes),
  layout version (u32), kind (u32), owner pid (i64), owner process create_time (f64, psutil
  seconds), payload bytes (u64), zero padding. The owner writes the magic last; `Segment.attach`
  waits for it, so a peer never sees a half-initialised segment.
- Ownership: the creator owns a segment and the semaphores named after it. It creates the segment
  file first and its semaphores before publishing the magic; it unlinks the semaphores first and
  the segment last. Only the owner unlinks (and `sweep_dead`, once the owner is dead).
- `sweep_dead(prefix)` unlinks segments whose owner is gone (pid dead, zombie, or reused: the
  create_time differs), segments with no valid header whose creator is known dead (a run_id that
  starts with `<pid>-` names its creating process, as the supervisor's run ids do) or, when the
  creator is unknown or its pid is alive, older than `grace_s`, and semaphores whose segment is
  gone or was swept. It never touches a segment whose owner is alive.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
import time

import posix_ipc
import psutil

PREFIX = "arl_"
SHM_DIR = "/dev/shm"
MAGIC = b"ARLSHM\x00\x01"
LAYOUT_VERSION = 1
HEADER_SIZE = 64
HEADER = struct.Struct("<8sIIqdQ")          # magic, layout version, kind, pid, create_time, payload
KIND_GENERIC, KIND_RING, KIND_COUNTER, KIND_WEIGHTS = 0, 1, 2, 3
PAGE = mmap.PAGESIZE
_PART = re.compile(r"[A-Za-z0-9_-]+\Z")
_MAX_NAME = 200                              # NAME_MAX is 255 and semaphores add "sem." + suffix


def segment_name(run_id: str, role: str) -> str:
    """`/arl_<run_id>_<role>`; both parts non-empty, characters [A-Za-z0-9_-]."""
    for what, part in (("run_id", run_id), ("role", role)):
        if not isinstance(part, str) or not _PART.match(part):
            raise ValueError(f"shm {what} must be non-empty [A-Za-z0-9_-], got {part!r}")
    name = f"/{PREFIX}{run_id}_{role}"
    if len(name) > _MAX_NAME:
        raise ValueError(f"shm name too long ({len(name)} > {_MAX_NAME}): {name}")
    return name


def sem_name(segment: str, suffix: str) -> str:
    """Name of a semaphore owned by `segment` (swept together with it)."""
    if not _PART.match(suffix):
        raise ValueError(f"semaphore suffix must be [A-Za-z0-9_-], got {suffix!r}")
    return f"{segment}.{suffix}"


_me: tuple[int, float] | None = None


def _self_identity() -> tuple[int, float]:
    global _me
    pid = os.getpid()
    if _me is None or _me[0] != pid:                 # recomputed after fork
        _me = (pid, psutil.Process(pid).create_time())
    return _me


def pid_alive(pid: int, create_time: float | None = None) -> bool:
    """True if `pid` runs (not a zombie) and, when given, was created at `create_time` (pid reuse)."""
    if pid <= 0:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(p.create_time() - create_time) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def read_header(fname: str) -> tuple[int, int, int, float, int] | None:
    """(layout version, kind, owner pid, owner create_time, payload) of /dev/shm/<fname>, or None."""
    try:
        with open(os.path.join(SHM_DIR, fname), "rb") as f:
            raw = f.read(HEADER_SIZE)
    except OSError:
        return None
    if len(raw) < HEADER_SIZE or raw[:8] != MAGIC:
        return None
    return HEADER.unpack_from(raw)[1:]


class Segment:
    """One mapped POSIX shm segment with the common header; payload starts at HEADER_SIZE."""

    def __init__(self, name: str, mm: mmap.mmap, owner: bool, kind: int, payload: int):
        self.name, self.mm, self.owner, self.kind, self.payload = name, mm, owner, kind, payload

    @classmethod
    def create(cls, name: str, payload: int, kind: int = KIND_GENERIC, init=None,
               prefault: bool = True) -> "Segment":
        """Create and map `name`; `init(mm)` runs (e.g. creating semaphores) before the magic is set."""
        size = HEADER_SIZE + payload
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError:
            raise FileExistsError(f"shm segment {name} already exists "
                                  "(left by a dead run? see shm.segments.sweep_dead)") from None
        try:
            if prefault:            # allocate every page now (one call, no page touched from Python):
                os.posix_fallocate(shm.fd, 0, size)     # a full /dev/shm is ENOSPC here, not SIGBUS later
            mm = mmap.mmap(shm.fd, size)
        except BaseException:
            shm.close_fd()
            posix_ipc.unlink_shared_memory(name)
            raise
        shm.close_fd()
        try:
            pid, ctime = _self_identity()
            HEADER.pack_into(mm, 0, b"\x00" * 8, LAYOUT_VERSION, kind, pid, ctime, payload)
            if init is not None:
                init(mm)
        except BaseException:
            mm.close()
            unlink_quietly(name)
            raise
        mm[0:8] = MAGIC                                # published last
        return cls(name, mm, True, kind, payload)

    @classmethod
    def attach(cls, name: str, kind: int, timeout: float = 10.0) -> "Segment":
        """Map an existing segment, waiting up to `timeout` s for it to exist and be initialised."""
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while True:
            seg = cls._try_attach(name, kind)
            if seg is not None:
                return seg
            if time.monotonic() >= deadline:
                raise TimeoutError(f"shm segment {name} did not appear (initialised) within {timeout}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    @classmethod
    def _try_attach(cls, name: str, kind: int) -> "Segment | None":
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            return None
        try:
            raw = os.pread(shm.fd, HEADER_SIZE, 0)
            if len(raw) < HEADER_SIZE or raw[:8] != MAGIC:   # not initialised yet
                return None
            _magic, ver, got_kind, _pid, _ct, payload = HEADER.unpack_from(raw)
            if ver != LAYOUT_VERSION or got_kind != kind or HEADER_SIZE + payload > shm.size:
                raise RuntimeError(f"shm segment {name}: layout {ver} kind {got_kind} payload {payload}, "
                                   f"expected layout {LAYOUT_VERSION} kind {kind}")
            mm = mmap.mmap(shm.fd, shm.size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            shm.close_fd()
        return cls(name, mm, False, kind, payload)

    @property
    def owner_pid(self) -> int:
        return HEADER.unpack_from(self.mm, 0)[3]

    def close(self) -> None:
        if not self.mm.closed:
            try:
                self.mm.close()
            except BufferError:                        # a caller still holds a view; GC unmaps later
                pass

    def unlink(self) -> None:
        if not self.owner:
            raise RuntimeError(f"only the owner of {self.name} may unlink it")
        unlink_quietly(self.name)


class Mapped:
    """Lifecycle shared by the shm objects built on a Segment: `close()` releases this process's
    views and then the mapping; `unlink()` removes the name (owner only); as a context manager the
    object closes, and the owner also unlinks. Subclasses list their views in `_views()` and free
    anything else first in `_before_close()`."""
    _seg: Segment

    def _views(self) -> tuple:
        return ()

    def _before_close(self) -> None:
        pass

    def close(self) -> None:
        if self._seg.mm.closed:
            return
        self._before_close()
        for view in self._views():
            view.release()
        self._seg.close()

    def unlink(self) -> None:
        self._seg.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        owner = self._seg.owner
        self.close()
        if owner:
            self.unlink()


def unlink_quietly(name: str, semaphore: bool = False) -> bool:
    try:
        (posix_ipc.unlink_semaphore if semaphore else posix_ipc.unlink_shared_memory)(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def list_entries(prefix: str = PREFIX) -> list[str]:
    """/dev/shm file names of this project's segments and semaphores (`sem.` kept) under `prefix`."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix) or n.startswith("sem." + prefix))


def _segment_of(fname: str) -> str:
    return fname[4:].split(".", 1)[0] if fname.startswith("sem.") else fname


def entry_owner(fname: str) -> tuple[int, float] | None:
    """(pid, create_time) owning a /dev/shm entry (a semaphore's is its segment's), or None."""
    hdr = read_header(_segment_of(fname))
    return None if hdr is None else (hdr[2], hdr[3])


_CREATOR = re.compile(re.escape(PREFIX) + r"(\d+)-")


def creator_pid(fname: str) -> int | None:
    """The pid encoded at the start of a run_id (`arl_<pid>-...`) of a /dev/shm entry, or None."""
    m = _CREATOR.match(_segment_of(fname))
    return int(m.group(1)) if m else None


def entry_owner_alive(fname: str, grace_s: float = 10.0) -> bool | None:
    """For a /dev/shm entry: True (owner alive or too young to judge), False (dead), None (gone)."""
    seg = _segment_of(fname)
    if not os.path.exists(os.path.join(SHM_DIR, seg)):
        return None if not os.path.exists(os.path.join(SHM_DIR, fname)) else False
    hdr = read_header(seg)
    if hdr is None:                                   # being created, or creator died before the magic
        creator = creator_pid(seg)
        if creator is not None and not pid_alive(creator):
            return False
        try:
            age = time.time() - os.stat(os.path.join(SHM_DIR, seg)).st_mtime
        except FileNotFoundError:
            return None
        return age < grace_s
    return pid_alive(hdr[2], hdr[3])


def remove_entry(fname: str) -> bool:
    """Unlink one /dev/shm entry of this project by its file name (`sem.` prefix = semaphore)."""
    if fname.startswith("sem."):
        return unlink_quietly("/" + fname[4:], semaphore=True)
    return unlink_quietly("/" + fname)


def sweep_dead(prefix: str = PREFIX, grace_s: float = 10.0) -> list[str]:
    """Unlink segments and semaphores under `prefix` whose owner is dead; return their posix names."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"sweep prefix must start with {PREFIX!r}: {prefix!r}")
    removed = []
    entries = list_entries(prefix)
    # segments first: a semaphore is judged by its segment, and must go when its segment went
    for fname in sorted(entries, key=lambda n: n.startswith("sem.")):
        if entry_owner_alive(fname, grace_s) is False and remove_entry(fname):
            removed.append("/" + (fname[4:] if fname.startswith("sem.") else fname))
    return removed
