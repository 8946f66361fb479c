"""scripts/bench_pipeline.py runs both modes; S=0 behaves as synchronous RL (age 0 on every step).
Throughput ratios are the benchmark's output, never asserted here."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_pipeline_reports_sync_and_async():
    out = subprocess.run([sys.executable, "scripts/bench_pipeline.py", "--rounds", "1", "--steps", "12"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {l.split()[0]: l.split() for l in out.stdout.splitlines() if "(S=" in l}
    assert set(rows) == {"sync", "async"}
    assert rows["sync"][4] == "0"                      # age max with S=0
    assert int(rows["async"][4]) >= 0
    assert "async / sync throughput:" in out.stdout
