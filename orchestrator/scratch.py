"""Per-run scratch directory, owned by the supervisor like its shm segments.

Contract: `create(run_id) -> path` makes `<tmp>/arl-scratch-<run_id>` (run ids start with the
supervisor's pid); workers get it as the environment variable `ARL_SCRATCH` and put their temporary
files there (e.g. the vLLM backend's saved model), so a worker killed at any instant leaks nothing:
`remove(path)` in the supervisor's `finally` takes everything. `sweep_dead()` removes the scratch
directories of supervisors that died without their `finally` (kill -9), at the next launch.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile

PREFIX = "arl-scratch-"
ENV = "ARL_SCRATCH"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-[0-9a-f]+\Z")


def create(run_id: str) -> str:
    path = os.path.join(tempfile.gettempdir(), PREFIX + run_id)
    os.makedirs(path, exist_ok=True)
    return path


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


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
