"""Shared pytest hooks: every test must leave none of this project's objects in /dev/shm."""
from __future__ import annotations

import os
import shutil
import tempfile

import psutil
import pytest

from shm import segments


def _left_by_us(fname: str) -> bool:
    """New entry owned by this process, a descendant, a dead process, or nobody (orphan)."""
    if not os.path.exists(os.path.join(segments.SHM_DIR, fname)):
        return False
    owner = segments.entry_owner(fname)
    if owner is None or owner[0] == os.getpid() or not segments.pid_alive(*owner):
        return True
    return owner[0] in {p.pid for p in psutil.Process().children(recursive=True)}


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
