"""scripts/bench_ring.py --quick runs and reports every metric against its target (no timing
assertion: the ratios are the benchmark's own output, not a test)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_ring_quick_reports_all_metrics():
    out = subprocess.run([sys.executable, "scripts/bench_ring.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [l for l in out.stdout.splitlines() if l.rstrip().endswith(("PASS", "MISS"))]
    assert len(rows) == 6
    for key in ("1 MB", "64 KB", "4 KB records", "4 KB us", "RTT", "100 MB"):
        assert any(key in r for r in rows), key
