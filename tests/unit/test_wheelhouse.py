"""scripts/wheelhouse.sh's guards, on folders made here (no download): a folder over the 64 MiB cap
or holding a torch/CUDA wheel is refused with one line and exit 1; bad arguments exit 2 before
anything is fetched. The download itself is tested by tests/integration/test_wheelhouse_install.py
(slow)."""
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "wheelhouse.sh"


def wheelhouse(*args):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def fake_wheel(folder: Path, name: str, mib: float) -> None:
    folder.mkdir(exist_ok=True)
    with open(folder / name, "wb") as f:
        f.truncate(int(mib * (1 << 20)))                 # sparse: its apparent size is what counts


def test_a_folder_over_the_cap_is_refused_in_one_line(tmp_path):
    fake_wheel(tmp_path, "small-1.0-py3-none-any.whl", 1)
    fake_wheel(tmp_path, "big-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", 63.5)
    out = wheelhouse(tmp_path, "--check")
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "64.5 MiB, over the 64 MiB cap" in lines[0], out.stderr
    assert "big-1.0-cp312" in lines[0]                   # names what fills it


def test_a_folder_under_the_cap_passes_and_prints_its_size(tmp_path):
    fake_wheel(tmp_path, "small-1.0-py3-none-any.whl", 63.9)
    out = wheelhouse(tmp_path, "--check")
    assert out.returncode == 0, out
    assert "1 wheels, 63.9 MiB of 64 MiB" in out.stdout


@pytest.mark.parametrize("name", ["torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl",
                                  "nvidia_nccl_cu13-2.28.3-py3-none-manylinux_2_18_x86_64.whl",
                                  "vLLM-0.32.0-cp38-abi3-manylinux_2_31_x86_64.whl"])
def test_gpu_image_wheels_are_refused(tmp_path, name):
    fake_wheel(tmp_path, name, 0.1)
    out = wheelhouse(tmp_path, "--check")
    assert out.returncode == 1 and "belong to the GPU image" in out.stderr and name in out.stderr, out


@pytest.mark.parametrize("args, why", [
    ([], "usage"),
    (["{d}", "--python", "12"], "--python 12 is not a Python version"),
    (["{d}", "--platform", "win_amd64"], "not a manylinux_2_N_ARCH tag"),
    (["{d}", "--frobnicate"], "unknown option --frobnicate"),
    (["{full}"], "is not empty"),
])
def test_bad_arguments_exit_2_in_one_line(tmp_path, args, why):
    fake_wheel(tmp_path / "full", "x-1.0-py3-none-any.whl", 0.1)
    args = [a.format(d=tmp_path / "new", full=tmp_path / "full") for a in args]
    out = wheelhouse(*args)
    assert out.returncode == 2 and why in out.stderr and len(out.stderr.strip().splitlines()) == 1, out
    assert not (tmp_path / "new").exists()
