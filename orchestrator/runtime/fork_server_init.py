"""The one module a run's fork server preloads (`orchestrator.runtime.forkserver`): in the server it
ignores SIGINT and SIGTERM, makes the server's exit quick, imports the workers' modules and then
says so.

- Signals: a terminal's Ctrl-C or systemd/Slurm's SIGTERM reaches the whole process group; the
  supervisor drains and then stops its workers itself, so neither the server (whose death would
  SIGKILL every worker through PR_SET_PDEATHSIG) nor a worker in its first instants (before
  `worker_base` ignores them too) may die of one. Python's fork server restores, in each child, the
  SIGINT disposition it found at its start: ignored, so a worker is never without it. The server's
  first ~50 ms (the interpreter starting) are not covered: a server killed then is started again by
  the next worker's start (`Spawner.start_server`).
- Exit: the server exits when the supervisor does, and its workers die with it: an interpreter that
  imported torch and transformers takes ~1.6 s to finalize, so the server skips finalization
  (`os._exit` as its first atexit handler, which runs last: after torch's own). Its workers never
  run it: a forked worker ends with `os._exit` (multiprocessing's bootstrap).
- Imports: the modules named in the environment (`forkserver.ENV`, JSON: "preload"); one that fails
  to import is left to the worker, which imports it again and reports the error as its own. Then it
  writes the "ready" file, which the supervisor waits for with its stop checks.
Importing this module anywhere but in a fork server does nothing (it reads its own command line).
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import signal

from orchestrator.runtime.forkserver import ENV

SERVER_CMD = b"from multiprocessing.forkserver import main"


def in_fork_server() -> bool:
    with open("/proc/self/cmdline", "rb") as f:
        return SERVER_CMD in f.read()


def _serve() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    atexit.register(os._exit, 0)
    plan = json.loads(os.environ.pop(ENV, "{}"))
    for name in plan.get("preload", ()):
        try:
            importlib.import_module(name)
        except Exception:          # the worker imports it again and reports it
            pass
    if plan.get("ready"):
        try:
            with open(plan["ready"], "w") as f:
                f.write(str(os.getpid()))
        except OSError:            # its run is gone (a supervisor killed meanwhile, its scratch
            pass                   # swept by the next launch): the server ends at its pipe's EOF


if in_fork_server():
    _serve()
