"""What every worker process does around its main loop.

`worker_entry(spec, main)` is the process target: it dies with its parent, the run's fork server, which
dies with the supervisor (PR_SET_PDEATHSIG plus a parent-pid watch; `orchestrator.runtime.forkserver`),
pins its devices (CUDA_VISIBLE_DEVICES before any torch import: the server preloads torch only for
CPU-only runs) or CPU threads,
logs to `run.dir/logs/<role><index>.log`, attaches its control ring and heartbeat word, starts its
liveness thread (`orchestrator.runtime.liveness.Stamper`: a word stamped whatever the main loop does, so a
stopped process is told from a slow step), runs `main(spec, ctx)`, and on any exception sends a `Fatal` message with the traceback before exiting 1.
Workers ignore SIGINT and SIGTERM (the supervisor stops them: Shutdown, then SIGKILL). Every main
loop calls `ctx.check_parent()` once per turn, which also stamps the heartbeat (monotonic ms) that
the supervisor's progress deadline reads; long operations call `ctx.beat()` around themselves.
"""
from __future__ import annotations

import ctypes
import errno
import faulthandler
import logging
import time
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable

from orchestrator import messages
from orchestrator.wire import Bell, send
from orchestrator.runtime.resources import RunNames
from orchestrator.runtime.liveness import Stamper
from orchestrator.runtime.signals import SIGNALS, ignore_in_worker

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerSpec:
    role: str                    # "inference" | "trainer"
    index: int
    names: RunNames
    config: dict                 # the resolved Config, as plain data (validated again in the child)
    parent_pid: int
    run_dir: str
    gen: int = 0                 # restart generation (names of this worker's rings)
    start_step: int = 0          # step the run (re)started at: part of the sampling seed
    devices: tuple[str, ...] = ()
    threads: int = 1
    env: dict = field(default_factory=dict)
    prompt_tokens: int = 0       # longest prompt of the run's prompt set (sizes vLLM's context)


_crash_log = None     # the log file faulthandler writes a native crash's stacks to


class ParentGone(SystemExit):
    pass


class WorkerContext:
    def __init__(self, spec: WorkerSpec, ctl, bell: Bell, heartbeat=None):
        self.spec, self.ctl, self.bell, self.heartbeat = spec, ctl, bell, heartbeat
        self.log = logging.getLogger(f"{spec.role}{spec.index}")

    def beat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.set(max(1, int(time.monotonic() * 1000)))

    def send(self, msg: messages.Msg, timeout: float = 30.0) -> None:
        send(self.ctl, msg, timeout)
        self.bell.ring()

    def check_parent(self) -> None:
        self.beat()
        if os.getppid() != self.spec.parent_pid:
            raise ParentGone(3)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL when the parent (the fork server's thread that forked this process) exits; exit 3 at
    once if it already has."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent_pid:      # parent died before prctl took effect
        os._exit(3)


def _setup_process(spec: WorkerSpec) -> None:
    from orchestrator.runtime.forkserver import detach_from_server
    die_with_parent(spec.parent_pid)
    detach_from_server()
    ignore_in_worker()                             # the supervisor decides when we stop
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)   # blocked in the fork server, inherited
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(spec.devices)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = str(spec.threads)
    os.environ.update(spec.env)
    logdir = os.path.join(spec.run_dir, "logs")
    os.makedirs(logdir, exist_ok=True)
    logging.raiseExceptions = False                # a full disk must not dump logging tracebacks
    logfile = os.path.join(logdir, f"{spec.role}{spec.index}.log")
    logging.basicConfig(filename=logfile, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # a native crash (SIGSEGV, SIGABRT from a library's thread) leaves every thread's Python stack
    # in the worker's log, where the supervisor's error message points
    global _crash_log
    _crash_log = open(logfile, "a")
    faulthandler.enable(file=_crash_log, all_threads=True)


def worker_entry(spec: WorkerSpec, main: Callable[[WorkerSpec, WorkerContext], None],
                 hard_exit: bool = False) -> None:
    """Run `main` as a worker process and exit with its status (0, 1 after a Fatal, 3 when the
    parent is gone). `hard_exit`: end with os._exit once everything is closed and flushed, skipping
    interpreter finalization, where native threads of a destroyed process group (gloo) may abort
    the process ("terminate called without an active exception", seen after a clean shutdown)."""
    from shm.counter import SharedCounter
    from shm.ring import Ring
    _setup_process(spec)
    ctl = Ring.attach(spec.names.ctl(spec.role, spec.index, spec.gen))
    bell = Bell.attach(spec.names.bell)
    heartbeat = SharedCounter.attach(spec.names.heartbeat(spec.role, spec.index, spec.gen))
    alive = SharedCounter.attach(spec.names.liveness(spec.role, spec.index, spec.gen))
    stamper = Stamper(alive).start()
    ctx = WorkerContext(spec, ctl, bell, heartbeat)
    ctx.log.info("forked by the fork server %d (%s)", os.getppid(),
                 "torch preloaded" if "torch" in sys.modules else "no torch preloaded")
    code = 0
    try:
        main(spec, ctx)
    except ParentGone:
        code = 3
    except BaseException as exc:      # process boundary: report, then exit non-zero
        code = 1
        tb = traceback.format_exc()
        ctx.log.error("fatal: %s", tb)
        line = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            line = f"DiskFull: no space left on device writing {exc.filename or spec.run_dir}"
        try:
            ctx.send(messages.Fatal(role=spec.role, index=spec.index, error=line, traceback=tb),
                     timeout=2.0)
        except Exception:
            pass
    finally:
        stamper.stop()
        logging.shutdown()
        ctl.close()
        bell.close()
        heartbeat.close()
        alive.close()
    if hard_exit:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)
