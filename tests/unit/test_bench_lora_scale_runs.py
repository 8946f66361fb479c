"""scripts/bench_lora_scale.py runs and prints a row per width, rank and alpha with the LoRA / full
ratio (no timing or value assertion: the figures are the benchmark's output, not a test)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_lora_scale_prints_every_case():
    pytest.importorskip("peft")
    out = subprocess.run([sys.executable, "scripts/bench_lora_scale.py", "--widths", "64",
                          "--ranks", "1,2", "--rounds", "1", "--steps", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if "alpha=" in line]
    assert len(rows) == 2 * 3 and all(r.split()[0] == "64" for r in rows)
