"""The kill-and-resume soak's launches and what it watches (scripts/kill_resume.py runs the rounds).

Contract: `launch(config, run_dir, overrides, err_path) -> Launch` starts `python -m
orchestrator.launch` in its own process group (FORCED overrides last); `wait`, `reap` and
`kill_group` bound every wait on it and clean up its group; `DirEvents` reports file-system moments
in a run directory (inotify via ctypes, else polling every CKPT_POLL_S) and `spin_until` busy-reads
them for a match or a hang; `CheckpointMoment` matches the moment of a commit a kill aims at; `Pinned` pins this process to one CPU and the supervisor to the others;
`check(run_dir, pids, final)` decodes the run's step lines and batches and returns the checks the
soak's JSON verdict carries (steps contiguous, prompts exactly once, the bound kept on resume, no
/dev/shm entry left).
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PHASES = ("startup", "recovery", "steady", "checkpoint", "drain")
FORCED = ("run.resume=auto", "rollout.filter_zero_std=false")
DRAIN_EXIT = (0, 128 + signal.SIGTERM)          # a drain that finishes before the kill
CKPT_POLL_S = 0.0005
POLL_S = 0.005
ORPHAN_WAIT_S = 5.0
_STEP_DIR = re.compile(r"step_(\d+)\Z")


# ---------------------------------------------------------------------------------------- files
def latest_name(run_dir) -> Optional[str]:
    try:
        with open(os.path.join(run_dir, "checkpoints", "latest")) as f:
            return f.read().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def _step_of(name) -> int:
    m = _STEP_DIR.match(name or "")
    return int(m.group(1)) if m else -1


def ckpt_state(run_dir) -> dict:
    try:
        names = os.listdir(os.path.join(run_dir, "checkpoints"))
    except FileNotFoundError:
        names = []
    committed = [_step_of(n) for n in names if _STEP_DIR.match(n)]
    return {"partials": sorted(n for n in names if n.endswith(".partial")),
            "committed": sorted(committed), "latest": latest_name(run_dir)}


def _segments_of(pids):
    prefixes = tuple(f"arl_{p}-" for p in pids)
    return sorted(n for n in os.listdir("/dev/shm") if n.removeprefix("sem.").startswith(prefixes))


def _tail(path, n=6) -> list[str]:
    """Last n lines of a stderr file, without traceback caret lines."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().strip().splitlines()
    except OSError:
        return []
    return [l for l in lines if l.strip(" ^~")][-n:]


class DirEvents:
    """Names created in / renamed into one directory, from Linux inotify (through ctypes), so that a
    kill can follow a file-system step of the runtime within microseconds. `open` returns None where
    inotify is unavailable (the callers then poll)."""
    IN_MOVED_TO, IN_CREATE = 0x80, 0x100
    _EV = struct.Struct("iIII")

    def __init__(self, fd: int):
        self.fd, self.buf = fd, []

    @classmethod
    def open(cls, path: str) -> Optional["DirEvents"]:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return None
            if libc.inotify_add_watch(fd, os.fsencode(path), cls.IN_MOVED_TO | cls.IN_CREATE) < 0:
                os.close(fd)
                return None
            return cls(fd)
        except (OSError, AttributeError):
            return None

    def sleep(self, timeout: float) -> None:
        """Wait up to `timeout` s for events; append (mask, name) of each to `buf`."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return
        self.buf += self.read()

    def read(self) -> list:
        """(mask, name) of the events queued now, without waiting."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        out, off = [], 0
        while off + self._EV.size <= len(data):
            _wd, mask, _cookie, n = self._EV.unpack_from(data, off)
            name = data[off + self._EV.size: off + self._EV.size + n].rstrip(b"\0")
            out.append((mask, os.fsdecode(name)))
            off += self._EV.size + n
        return out

    def take(self) -> list:
        out, self.buf = self.buf, []
        return out

    def close(self) -> None:
        os.close(self.fd)


class Pinned:
    """This process on one CPU, the supervisor's threads on the others (best effort; `ok` False
    with a single CPU or where not permitted): a busy-waiting soak then never delays the run."""

    def __init__(self, pid: int):
        self.mine, self.ok = None, False
        try:
            self.mine = os.sched_getaffinity(0)
            if len(self.mine) < 2:
                return
            cpu = min(self.mine)
            threads = psutil.Process(pid).threads()
            os.sched_setaffinity(0, {cpu})
            for t in threads:
                os.sched_setaffinity(t.id, self.mine - {cpu})
            self.ok = True
        except (OSError, psutil.Error):
            pass

    def close(self) -> None:
        if self.mine is not None:
            try:
                os.sched_setaffinity(0, self.mine)
            except OSError:
                pass


class CheckpointMoment:
    """Which moment of a checkpoint's commit a kill aims at (`mode`: "partial", "renamed" or
    "after_latest"), matched from DirEvents (`by_event`, `renamed` for `spin_until`) or by polling
    `ckpt_state` against `base`, the state before it; `seen` names the moment that matched."""

    def __init__(self, run_dir: str, mode: str, base: dict):
        self.run_dir, self.mode, self.base = run_dir, mode, base
        self.seen: Optional[str] = None

    def by_event(self, ev: "DirEvents") -> bool:
        for mask, name in ev.take():
            if self.mode == "partial" and mask & ev.IN_CREATE and name.endswith(".partial"):
                self.seen = "partial"
            elif self.mode == "renamed" and mask & ev.IN_MOVED_TO and _STEP_DIR.match(name):
                self.seen = "renamed_before_latest"
            elif mask & ev.IN_MOVED_TO and name == "latest":
                self.seen = "latest_changed"
            else:
                continue
            return True
        return False

    def by_poll(self) -> bool:
        st, base = ckpt_state(self.run_dir), self.base
        new_dirs = [k for k in st["committed"] if k not in base["committed"]]
        if self.mode == "partial" and set(st["partials"]) - set(base["partials"]):
            self.seen = "partial"
        elif self.mode == "renamed" and max(new_dirs, default=-1) > _step_of(st["latest"]):
            self.seen = "renamed_before_latest"
        elif st["latest"] != base["latest"]:
            self.seen = "latest_changed"
        else:
            return False
        return True

    def renamed(self, mask: int, name: str) -> bool:
        if mask & DirEvents.IN_MOVED_TO and _STEP_DIR.match(name):
            self.seen = "renamed_before_latest"
        elif mask & DirEvents.IN_MOVED_TO and name == "latest":
            self.seen = "latest_changed"
        else:
            return False
        return True


def spin_until(ln: "Launch", ev: DirEvents, match: Callable[[int, str], bool], hang_s: float) -> str:
    """Busy-read `ev` and kill -9 the supervisor the moment an event matches ('killed'): within
    microseconds of the runtime's file-system step. Else 'exited' or 'hang'."""
    next_poll = 0.0
    while True:
        for mask, name in ev.read():
            if match(mask, name):
                try:
                    os.kill(ln.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return "killed"
        now = time.monotonic()
        if now >= next_poll:
            next_poll = now + 0.05
            if ln.proc.poll() is not None:
                return "exited"
            if now - ln.last_progress > hang_s:
                return "hang"
            ln.poll()


def _spin(seconds: float) -> None:
    """Busy-wait a few ms (a sleep could overshoot the moment)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


# ---------------------------------------------------------------------------------------- checks
def check(run_dir, pids=(), final=True) -> dict:
    """`orchestrator.audit.audit` of the run directory, plus no /dev/shm entry of the supervisor
    `pids` left (final only)."""
    from orchestrator.run.audit import audit
    result = audit(run_dir, final=final)
    leftovers = _segments_of(pids) if final else []
    if leftovers:
        result["failures"].append(f"/dev/shm entries left: {leftovers[:10]}")
    result.update(shm_leftovers=leftovers, ok=not result["failures"])
    return result


# ---------------------------------------------------------------------------------------- launches
@dataclass
class Launch:
    proc: subprocess.Popen
    run_dir: str
    err_path: str
    wall0: float = field(default_factory=time.time)
    mono0: float = field(default_factory=time.monotonic)
    children: list = field(default_factory=list)
    steps: list = field(default_factory=list)        # step lines written by this launch
    resume_event: bool = False
    first_step_s: Optional[float] = None
    last_progress: float = field(default_factory=time.monotonic)
    _sig: tuple = ()
    _next_children: float = 0.0
    _next_metrics: float = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def elapsed(self) -> float:
        return time.monotonic() - self.mono0

    def poll(self, metrics_every: float = 0.02) -> None:
        now = time.monotonic()
        if now >= self._next_children:
            self._next_children = now + 0.05
            try:   # every descendant seen, including restarted workers
                for c in psutil.Process(self.pid).children(recursive=True):
                    if c not in self.children:
                        self.children.append(c)
            except (psutil.Error, OSError):
                pass
        if now >= self._next_metrics:
            self._next_metrics = now + metrics_every
            for rec in self._new_lines():
                if rec.get("time", 0) < self.wall0:
                    continue
                if rec.get("kind") == "event" and rec.get("event") == "resume":
                    self.resume_event = True
                elif rec.get("kind") == "step":
                    self.steps.append(rec)
                    self.last_progress = time.monotonic()
                    if self.first_step_s is None:
                        self.first_step_s = round(time.monotonic() - self.mono0, 3)

    def _new_lines(self) -> list[dict]:
        """Complete lines appended to metrics.jsonl since the last call (re-read from the start
        when the file was replaced or shrank: a resume rewrites it)."""
        path = os.path.join(self.run_dir, "metrics.jsonl")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return []
        ino, off = self._sig or (None, 0)
        if st.st_ino != ino or st.st_size < off:
            off = 0
        if st.st_size == off:
            self._sig = (st.st_ino, off)
            return []
        with open(path, "rb") as f:
            f.seek(off)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._sig = (st.st_ino, off + end)
        out = []
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


def launch(config, run_dir, overrides, err_path) -> Launch:
    wall0, mono0 = time.time(), time.monotonic()
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config", config,
                                 f"run.dir={run_dir}", *overrides, *FORCED],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    return Launch(proc, run_dir, err_path, wall0, mono0, last_progress=mono0)


def wait(ln: Launch, until: Optional[Callable[[], bool]] = None, deadline: Optional[float] = None,
         hang_s: float = 60.0, poll_s: float = POLL_S, metrics_every: float = 0.02,
         sleep: Callable[[float], None] = time.sleep) -> str:
    """Poll a launch until `until()` holds ('event'), it exits ('exited'), `deadline` (monotonic)
    passes ('deadline'), or it makes no progress (no new step line) for hang_s ('hang').
    `sleep(poll_s)` waits between polls (DirEvents.sleep wakes up on a file-system event)."""
    while True:
        if until is not None and until():
            return "event"
        if ln.proc.poll() is not None:
            return "exited"
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return "deadline"
        if now - ln.last_progress > hang_s:
            return "hang"
        ln.poll(metrics_every)
        sleep(poll_s)


def _group_members(pgid) -> list:
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and os.getpgid(p.pid) == pgid:
                out.append(p)
        except (OSError, psutil.Error):
            pass
    return out


def _running(p) -> bool:
    """Alive and not a zombie (an orphan reparented to a non-reaping init stays a zombie)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def reap(ln: Launch, since: float) -> list[str]:
    """After the supervisor is gone: its descendants (polled ones and its process group) must be
    gone by `since` + 5 s. Returns the ones alive, then kills the group as clean-up."""
    procs = list(ln.children) + [p for p in _group_members(ln.pid) if p not in ln.children]
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() >= since + ORPHAN_WAIT_S:
            break
        time.sleep(0.05)
    names = []
    for p in alive:
        try:
            names.append(f"{p.pid}:{p.name()}")
            p.kill()
        except (psutil.Error, OSError):
            pass
    kill_group(ln)
    return names


def kill_group(ln: Launch) -> None:
    try:
        os.killpg(ln.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        ln.proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
