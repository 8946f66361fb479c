"""kill -9 while the supervisor creates its segments: an immediate restart removes everything the
dead run left, including a segment whose header was never written."""
import os
import signal
import time

from tests.integration.lifecycle import run, run_segments, start


def test_kill_during_segment_creation_leaves_nothing_after_a_restart(tmp_path):
    # a 1 GiB weight buffer takes a while to prefault: kill while its header is not yet written
    proc = start(tmp_path, "run.total_steps=3", f"actor.sim.weight_bytes={1 << 30}")
    deadline = time.monotonic() + 30
    while not any(n.endswith("_weights") for n in run_segments(proc)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    left = run_segments(proc)
    assert any(n.endswith("_weights") for n in left)
    with open(f"/dev/shm/{[n for n in left if n.endswith('_weights')][0]}", "rb") as f:
        assert f.read(8) != b"ARLSHM\x00\x01"          # really header-less
    again = run(tmp_path, "run.total_steps=3", "run.resume=never")
    assert again.returncode == 0, again.stderr
    assert run_segments(proc) == []
