"""Preflight names a torch the torch backends cannot use (#28 item 4): older than MIN_TORCH (2.11,
the GPU image's), or a CPU-only build where a CUDA device is configured; read from the installed
torch's metadata, without importing it."""
import subprocess
import sys

import pytest

from orchestrator.runtime import preflight
from orchestrator.config import ConfigError, load_config


@pytest.mark.parametrize("version, cuda, problem", [
    ("2.11.0+cu130", True, None),                      # the GPU image's
    ("2.13.0+cpu", False, None),                       # the CPU test machines'
    ("2.11.0a0+6ddf5cf85e.nv25.01", True, None),       # a vendor build: no 'cpu' label
    ("3.0.0", True, None),
    ("2.10.1+cu128", True, "older than the 2.11"),
    ("1.13.1", False, "older than the 2.11"),
    ("2.13.0+cpu", True, "CPU-only build"),
])
def test_torch_problem(version, cuda, problem):
    got = preflight.torch_problem(version, cuda)
    assert (got is None) if problem is None else (problem in got and version in got)


def test_the_installed_torch_passes_on_cpu_and_a_cpu_build_is_named_for_a_device():
    from importlib import metadata
    version = metadata.version("torch")
    preflight._check_torch(load_config(None))           # the default job: torch backends on CPU
    if version.endswith("+cpu"):
        with pytest.raises(ConfigError, match=r"CPU-only build: inference.devices / actor.device"):
            preflight._check_torch(load_config(None, ["inference.devices=['0']"]))


def test_the_check_imports_no_torch():
    code = ("import sys; from orchestrator.runtime import preflight; from orchestrator.config import load_config; "
            "preflight._check_torch(load_config(None)); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
