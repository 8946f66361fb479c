"""How worker processes start: forked from a fork server that imported their modules once.

A torch worker spends most of its start importing torch and transformers' modeling code (~10 s of
CPU on a free core), and under the spawn start method every worker of a run, every trainer rank and
every restart paid it again. `Spawner(cfg)` starts workers with multiprocessing's forkserver
instead: one server process per run, which imports the workers' modules (`preload_for(cfg)`) and
then forks each worker on request, so a run pays the imports once.

- Start: `start_server(workdir)` starts the server, which imports while the supervisor goes on (its
  only preload is `orchestrator.runtime.fork_server_init`, which imports the list it is given in
  the environment and then writes a file in `workdir`); `wait_ready(timeout_s, check)` waits for
  that file, calling `check()` (the supervisor's stop check) every few ms, so a signal during the
  imports is answered at once, and a server that never finishes is an error, not a hang.
- Signals: the server ignores SIGINT and SIGTERM from its first import, and every worker it forks
  starts ignoring them: a signal to the process group neither kills the server nor a worker in its
  first instants (the supervisor drains and stops them, `worker_base`).
- Parents: a worker's parent is the server, so `server_pid()` is the pid workers watch
  (PR_SET_PDEATHSIG and the parent-pid check, `worker_base`). The server exits when the supervisor
  does (EOF on its pipe, Python's fork server contract: it lives while a holder of the pipe's write
  end does, and Python hands that end to every child, so each worker closes its copy first thing,
  `detach_from_server()`), and skips interpreter finalization, so a worker of a supervisor killed
  with SIGKILL still dies within a fraction of a second, one link later.
- Devices: torch and transformers are preloaded only on CPU-only runs of the torch backends. Where a
  worker gets CUDA devices nothing imports torch before the worker sets CUDA_VISIBLE_DEVICES (and
  the server never touches CUDA); vLLM reads its environment as it imports, so vLLM runs preload
  nothing heavy either.
- End: `close()` (the supervisor's `finally`, after every worker is stopped) kills the server and
  reaps it, so that no process outlives the run; a later run in the same process starts a server of
  its own. Python keeps one fork server per process: a supervisor run inside a process that already
  runs a fork server of its own would find it without the ready file and fail at
  `run.startup_timeout_s` (the launch process never has one).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from multiprocessing import forkserver
from typing import Callable

from orchestrator.config import Config

ENV = "ARL_FORK_SERVER"           # {"preload": [modules], "ready": path}: read by fork_server_init
INIT = "orchestrator.runtime.fork_server_init"
READY = "fork-server-ready"
WORKERS = ("orchestrator.runtime.trainer_worker", "orchestrator.runtime.inference_worker")
TORCH = ("torch", "transformers.models.llama.modeling_llama",     # the built-in model's class and
         "orchestrator.backends.torch_trainer", "orchestrator.backends.torch_inference")  # the rest
POLL_S = 0.02


def preload_for(cfg: Config) -> tuple[str, ...]:
    """The modules the server imports before it forks a worker: the workers' own, plus torch,
    transformers' modeling code and the torch backends where both backends are torch on CPU."""
    cpu = not cfg.inference.devices and not cfg.actor.rank_devices
    if cpu and cfg.inference.backend == "torch" and cfg.actor.backend == "torch":
        return WORKERS + TORCH + (("peft",) if cfg.actor.lora is not None else ())
    return WORKERS


class Spawner:
    """Owner of a run's fork server (one per run; the supervisor's main thread calls every method).
    `Spawner(preload=modules)`: one that imports `modules` (a Ray host's, `ray_host`)."""

    def __init__(self, cfg: Config | None = None, preload: tuple[str, ...] = ()) -> None:
        self.preload = list(preload_for(cfg) if cfg is not None else preload)
        self.ctx = mp.get_context("forkserver")
        self.ready = ""

    def start_server(self, workdir: str) -> int:
        """Start the server if it is not running (it begins importing at once) and return its pid;
        the server writes `workdir`/fork-server-ready when its imports are done."""
        self.ready = os.path.join(workdir, READY)
        self.ctx.set_forkserver_preload([INIT])
        os.environ[ENV] = json.dumps({"preload": self.preload, "ready": self.ready})
        try:                       # the server inherits the environment as it starts
            forkserver._forkserver.ensure_running()
        finally:
            os.environ.pop(ENV, None)
        return self.server_pid()

    def wait_ready(self, timeout_s: float, check: Callable[[], None]) -> float:
        """Wait until the server has imported its modules, calling `check()` every POLL_S; returns
        the seconds waited. TimeoutError after `timeout_s`."""
        t0 = time.monotonic()
        while not os.path.exists(self.ready):
            check()
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"the fork server was still importing their modules "
                                   f"({', '.join(self.preload)})")
            time.sleep(POLL_S)
        return time.monotonic() - t0

    def server_pid(self) -> int:
        pid = forkserver._forkserver._forkserver_pid
        if pid is None:
            raise RuntimeError("the fork server is not running")
        return pid

    def process(self, target, args: tuple, name: str):
        """A worker process, not yet started: `start()` asks the server to fork it."""
        return self.ctx.Process(target=target, args=args, daemon=False, name=name)

    def close(self) -> None:
        """Kill and reap the server (its workers are gone by now): SIGKILL cannot be blocked, so the
        reap returns as soon as the kernel has torn it down."""
        server = forkserver._forkserver
        if server._forkserver_pid is None:
            return
        try:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server._stop()           # closes its pipe, reaps it, forgets its address


def detach_from_server() -> None:
    """In a worker, first thing: close the copy of the server's liveness pipe that Python's fork
    server hands every child, so that the server (and through PR_SET_PDEATHSIG, this worker) ends
    when the supervisor does. A worker starts no process through the fork server."""
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
