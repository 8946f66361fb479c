"""A weight sync that never completes raises a clear error instead of a quiet halt."""
from tests.integration.lifecycle import run_segments, start


def test_stalled_weight_sync_fails_loudly(tmp_path):
    proc = start(tmp_path, "run.total_steps=50", "inference.sim.reload_delay_s=3",
                 "weights.sync_timeout_s=0.5", "run.shutdown_timeout_s=2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "weight sync to version 1" in err and "weights.sync_timeout_s=0.5" in err
    assert run_segments(proc) == []
