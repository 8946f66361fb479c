"""scripts/gpu_check.sh on a machine without CUDA says so in one line and exits 2 before installing
anything; its report turns the steps' files into one JSON and README rows (failed steps left out)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def gpu_check(*args, **env):
    return subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), *map(str, args)],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", **env})


def test_no_cuda_is_one_line_and_exit_2(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = gpu_check("--wheelhouse", tmp_path / "none", PYTHON=sys.executable)
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "no CUDA device" in out.stderr
    assert out.stdout == "" and not (ROOT / "runs" / "gpu_check" / "none").exists()


def test_no_torch_and_bad_arguments_exit_2(tmp_path):
    bare = tmp_path / "bare"                     # a Python without torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", bare], check=True, timeout=60)
    out = gpu_check(PYTHON=bare / "bin" / "python")
    assert out.returncode == 2 and "no torch here" in out.stderr, out
    out = gpu_check("--frobnicate", PYTHON=sys.executable)
    assert out.returncode == 2 and "unknown argument --frobnicate" in out.stderr


def test_report_writes_one_json_and_the_readme_rows(tmp_path):
    (tmp_path / "machine.txt").write_text("1 x NVIDIA H200, torch 2.11.0+cu130\n")
    (tmp_path / "steps.tsv").write_text("gpu-tests\t0\t40.2\t120\ndefault-job\t0\t30.1\t75\n"
                                        "bench-weights\t0\t20.0\t75\nbench-trainer\t124\t75.0\t75\n")
    (tmp_path / "gpu_tests.log").write_text("....s\n4 passed, 1 skipped in 39.0s\n")
    (tmp_path / "default_job.args").write_text("inference.devices=['0']\n")
    run = tmp_path / "default_job"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(
        {"kind": "step", "step": i, "time": 100 + i / 4, "reward_mean": i / 20, "weight_sync_s": 0.01,
         "age_max": 2}) + "\n" for i in range(1, 21)))
    (tmp_path / "bench_weights.json").write_text(json.dumps({"cpu": [], "cuda_ipc": {
        "params": 1500000000, "bytes": 3000000000, "reload_ms": 2.5, "reload_gb_s": 1200.0,
        "d2d_ms": 1.5, "d2d_gb_s": 2000.0, "reload_over_d2d": 1.67, "publish_ms": 2.0}}))
    out = tmp_path / "all.json"
    got = subprocess.run([sys.executable, str(ROOT / "scripts/gpu_check.py"), "report", tmp_path, out,
                          "2026-12-05"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    rows = got.stdout.splitlines()
    assert rows[0] == "| 2026-12-05 | 1 x NVIDIA H200, torch 2.11.0+cu130 | `pytest -m gpu` | 4 passed, 1 skipped in 39.0s |"
    assert "20 steps at 4.0 steps/s; reward 0.05 -> 0.78" in rows[1] and "inference.devices=['0']" in rows[1]
    assert "3.0 GB: 2.5 ms (1200 GB/s) vs a device-to-device copy 1.5 ms (2000 GB/s): 1.67x" in rows[2]
    assert rows[3] == "<!-- not in the table: bench-trainer (exit 124, timed out) -->"
    saved = json.loads(out.read_text())
    assert saved["steps"]["bench-trainer"]["rc"] == 124 and saved["default_job"]["steps"] == 20
