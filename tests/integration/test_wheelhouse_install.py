"""#28 on CPU: a fresh virtual environment that has torch (and the numpy and pyarrow a GPU image
carries, which the wheelhouse leaves to it) installs everything else from a wheelhouse made by
scripts/wheelhouse.sh, with --no-index, through scripts/gpu_check.sh's own install step; the
installed (non-editable) package then runs its embedded default job from a directory outside the
checkout, with the C ring built for this machine. Slow: a real download, a venv, a torch install."""
import json
import platform
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def sh(*cmd, timeout=900, **kw):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_a_torch_venv_installs_from_the_wheelhouse_and_runs_the_default_job(tmp_path):
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    glibc = platform.libc_ver()[1].split(".")[1]
    wh = tmp_path / "wheelhouse"
    made = sh("bash", ROOT / "scripts/wheelhouse.sh", wh, "--python", py,
              "--platform", f"manylinux_2_{glibc}_{platform.machine()}")
    assert "carries the C ring extension" in made.stdout, made.stdout
    names = [p.name.lower() for p in wh.iterdir()]
    assert not [n for n in names if n.startswith(("torch", "nvidia", "triton", "vllm"))]
    assert not [n for n in names if n.startswith(("numpy", "pyarrow"))]      # left to the image
    assert sum(p.stat().st_size for p in wh.iterdir()) <= 64 << 20

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)                  # plain: no system site-packages
    vpy = env_dir / "bin" / "python"
    sh(vpy, "-m", "pip", "install", "-q", "torch==2.13.0", "numpy", "pyarrow")   # "the image"
    site = tmp_path / "site"
    sh("bash", ROOT / "scripts/gpu_check.sh", "--wheelhouse", wh, "--install-only", site,
       env={"PATH": "/usr/bin:/bin", "PYTHON": str(vpy), "HOME": str(tmp_path)})

    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    where = sh(vpy, "-c", "import orchestrator.config as c, shm._ringfast as r; "
                          "print(c.__file__); print(c.DEFAULT_CONFIG); print(r.__file__)", cwd=away, env=env)
    files = where.stdout.split()
    assert all(f.startswith(str(site)) for f in files), files            # the installed copy, not ROOT
    sh(vpy, "-m", "orchestrator.launch", "run.dir=run", "run.total_steps=20", "run.progress=false",
       "eval.every_steps=0", cwd=away, env=env, timeout=300)
    steps = [json.loads(line) for line in open(away / "run" / "metrics.jsonl")]
    assert [r["step"] for r in steps if r["kind"] == "step"][-1] == 20
