"""scripts/bench_pipeline.py runs both modes; S=0 behaves as synchronous RL (age 0 on every step),
for the sim workload and for the multi-turn tool job with a long-tailed tool latency (episodes
spanning turns are still never older than the version they trained at under S=0).
Throughput ratios are the benchmark's output, never asserted here."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("workload", [
    [], pytest.param(["--backend", "multiturn", "--tool-latency", "0.02"], marks=pytest.mark.slow)],
    ids=["sim", "multiturn"])
def test_bench_pipeline_reports_sync_and_async(workload):
    if workload:
        pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "scripts/bench_pipeline.py", "--rounds", "1", "--steps", "12",
                          *workload], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = {l.split()[0]: l.split() for l in out.stdout.splitlines() if "(S=" in l or "(M=" in l}
    assert set(rows) == ({"sync", "async"} if workload else {"sync", "async", "determ."})
    if not workload:          # run.deterministic: every head exactly S old once warm, nothing dropped
        assert rows["determ."][1] == "(S=2)" and rows["determ."][6] == "2"
        assert "deterministic / free async throughput:" in out.stdout
    assert rows["sync"][6] == "0" and rows["sync"][7] == "0.0"      # age max, p99 with S=0
    assert rows["async"][1] == "(S=2)"
    age_max, age_p99, age_mean = int(rows["async"][6]), float(rows["async"][7]), float(rows["async"][8])
    assert 0 < age_mean <= age_max and 0 < age_p99 <= age_max    # async really runs ahead ...
    if not workload:                                   # ... and, without a long tail, within the
        assert age_max <= 2 + 1                        # gate's S (+1: a reload between finish and take)
    if not workload:                      # the sim workload is also divided by the event model
        assert float(rows["async"][4]) > 0 and "async / ideal event model:" in out.stdout
    assert "async / sync throughput:" in out.stdout


def test_bench_pipeline_long_tail_with_the_hard_bound():
    """A lognormal long tail with the hard bound as a third mode: its row never shows an age above
    M, and the bench prints its throughput against the gate alone."""
    out = subprocess.run([sys.executable, "scripts/bench_pipeline.py", "--rounds", "1", "--steps", "16",
                          "--latency", "0.05", "--sigma", "1.5", "--bound", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = {l.split()[0]: l.split() for l in out.stdout.splitlines() if "(S=" in l or "(M=" in l}
    assert set(rows) == {"sync", "async", "bound", "determ."}
    assert int(rows["bound"][6]) <= 3                             # age max
    assert "bound / gate alone throughput:" in out.stdout and "lognormal sigma 1.5" in out.stdout
