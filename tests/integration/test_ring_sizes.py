"""Rings are sized from the config: a long-context batch (B=32 groups x 16 samples x ~8k tokens, ~55
MB per batch record, beyond the old fixed 32 MiB batch ring) trains to the end; a config whose record
could never fit any shared memory is refused at config time (exit 2, fields named, nothing created)."""
import subprocess
import sys
from pathlib import Path

from tests.integration.lifecycle import run_segments

ROOT = Path(__file__).resolve().parents[2]
OLD_BATCH_RING = 32 << 20


def launch(*args, timeout=120):
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config", "configs/sim.yaml",
                             *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"launch did not finish in {timeout}s: {err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc


def test_long_context_batch_trains(tmp_path):
    run_dir = tmp_path / "run"
    out, proc = launch(f"run.dir={run_dir}", "run.total_steps=2", "run.checkpoint_every=0",
                       "rollout.consumer_batch_size=32", "rollout.group_size=16",
                       "rollout.max_concurrent_rollouts=32", "rollout.max_new_tokens=8192",
                       "inference.sim.completion_tokens=8192", "rollout.filter_zero_std=false")
    assert out.returncode == 0, out.stderr[-3000:]
    batches = sorted((run_dir / "batches").iterdir())
    assert len(batches) >= 2, batches
    from orchestrator.run.durable import read_record
    sizes = [len(read_record(str(b))) for b in batches]    # the record (files are zstd-compressed)
    assert min(sizes) > OLD_BATCH_RING, sizes         # each batch was beyond the old fixed ring
    assert run_segments(proc) == []


def test_record_that_fits_no_memory_is_refused_at_config_time(tmp_path):
    run_dir = tmp_path / "run"
    out, proc = launch(f"run.dir={run_dir}", "rollout.consumer_batch_size=4096",
                       "rollout.group_size=1024", "rollout.max_new_tokens=1000000",
                       "inference.sim.completion_tokens=1000000", timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    for field in ("rollout.group_size", "rollout.max_new_tokens"):
        assert field in lines[0], lines[0]
    assert "Traceback" not in out.stderr
    assert not run_dir.exists()
    assert run_segments(proc) == []
