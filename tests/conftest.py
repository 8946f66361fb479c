"""Shared pytest hooks: every test must leave none of this project's objects in /dev/shm."""
from __future__ import annotations

import multiprocessing.process
import os
import shutil
import subprocess
import tempfile

import psutil
import pytest

from shm import segments


# Every process this pytest process started: the leak check attributes an entry by its owner (the
# header's pid) or its creator (the pid a run's segment names start with), so that tests running in
# parallel (pytest-xdist workers, or a second session) never count each other's entries.
_STARTED: set[int] = set()


def _track_starts() -> None:
    popen_init, mp_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def init(self, *args, **kwargs):
        popen_init(self, *args, **kwargs)
        _STARTED.add(self.pid)

    def start(self):
        mp_start(self)
        _STARTED.add(self.pid)
    subprocess.Popen.__init__ = init
    multiprocessing.process.BaseProcess.start = start


_track_starts()


def _left_by_us(fname: str) -> bool:
    """A new entry whose owner or creator is this process, one it started (alive or dead), or a
    live descendant; an entry with neither owner nor creator (an orphan) counts as ours."""
    if not os.path.exists(os.path.join(segments.SHM_DIR, fname)):
        return False
    owner = segments.entry_owner(fname)
    creator = segments.creator_pid(fname)
    if owner is None and creator is None:
        return True
    ours = {os.getpid(), *_STARTED} | {p.pid for p in psutil.Process().children(recursive=True)}
    return (owner is not None and owner[0] in ours) or creator in ours


_HF_DATASETS_CACHE = None


def pytest_configure(config):
    """Datasets converted by `datasets` (and every launch a test starts) cache under one temporary
    directory of this session, never the user's ~/.cache."""
    global _HF_DATASETS_CACHE
    if "HF_DATASETS_CACHE" not in os.environ:
        _HF_DATASETS_CACHE = tempfile.mkdtemp(prefix="arl-test-datasets-")
        os.environ["HF_DATASETS_CACHE"] = _HF_DATASETS_CACHE


def pytest_unconfigure(config):
    if _HF_DATASETS_CACHE is not None:
        shutil.rmtree(_HF_DATASETS_CACHE, ignore_errors=True)
        os.environ.pop("HF_DATASETS_CACHE", None)


@pytest.fixture(autouse=True)
def _no_shm_leftovers():
    before = set(segments.list_entries())
    yield
    leaked = [f for f in segments.list_entries() if f not in before and _left_by_us(f)]
    for fname in leaked:
        segments.remove_entry(fname)
    assert not leaked, f"test left shared memory in {segments.SHM_DIR}: {leaked}"


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory):
    """A tiny HF model directory (tests/hf_model.py), built once per session; copy it to alter it."""
    pytest.importorskip("transformers")
    from tests.hf_model import build_hf_model_dir
    return build_hf_model_dir(tmp_path_factory.mktemp("hf_model") / "tiny")
