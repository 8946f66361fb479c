"""Per-run scratch directory, owned by the supervisor like its shm segments.

Contract: `create(run_id) -> path` makes `<tmp>/arl-scratch-<run_id>` (run ids start with the
supervisor's pid); workers get it as the environment variable `ARL_SCRATCH` and put their temporary
files there (e.g. the vLLM backend's saved model), so a worker killed at any instant leaks nothing:
`remove(path)` in the supervisor's `finally` takes everything. `sweep_dead()` removes the scratch
directories of supervisors that died without their `finally` (kill -9), at the next launch.

Engines that keep files outside it: a vLLM engine's temporary files go to `engine_home()`, a
directory of the worker's own (`engine-<pid>`) that the worker makes its TMPDIR; vLLM's rendezvous
file there (`vllm_dist_<hex>`) names the engine's shared memory in /dev/shm (`vllm_dist_<hex>-*`,
its CPU tensor-parallel buffers), which `release_engines(path)` unlinks: only entries named after a
file under `path`, never another run's or program's. `remove` releases them first (every worker is
dead by then); `engine_home()` also releases the homes of dead workers (a killed worker's engine,
before its restart takes over).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Optional

from shm.segments import SHM_DIR

PREFIX = "arl-scratch-"
ENV = "ARL_SCRATCH"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-[0-9a-f]+\Z")


ENGINE_PREFIX = "vllm_dist_"
_HOME = re.compile(r"engine-(\d+)\Z")


def create(run_id: str) -> str:
    path = os.path.join(tempfile.gettempdir(), PREFIX + run_id)
    os.makedirs(path, exist_ok=True)
    return path


def remove(path: str) -> None:
    release_engines(path)
    shutil.rmtree(path, ignore_errors=True)


def release_engines(path: str) -> list[str]:
    """Unlink the /dev/shm entries of the engines whose rendezvous files lie under `path`."""
    idents = [f + "-" for _, _, files in os.walk(path) for f in files if f.startswith(ENGINE_PREFIX)]
    if not idents or not os.path.isdir(SHM_DIR):
        return []
    gone = []
    for name in os.listdir(SHM_DIR):
        if name.startswith(tuple(idents)):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                gone.append(name)
            except FileNotFoundError:
                pass
    return gone


def engine_home() -> Optional[str]:
    """`<scratch>/engine-<pid>` for this process (None outside a run: no ARL_SCRATCH), after
    removing the homes of dead processes there with their engines' /dev/shm entries."""
    root = os.environ.get(ENV)
    if not root or not os.path.isdir(root):
        return None
    for name in os.listdir(root):
        m = _HOME.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            remove(os.path.join(root, name))
    home = os.path.join(root, f"engine-{os.getpid()}")
    os.makedirs(home, exist_ok=True)
    return home


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_dead() -> list[str]:
    root, gone = tempfile.gettempdir(), []
    for name in os.listdir(root):
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            remove(os.path.join(root, name))
            gone.append(name)
    return gone
