"""Parent death: kill -9 of the supervisor takes every worker down within 5 s; the next run sweeps
the dead run's segments and resumes."""
import os
import signal

from tests.integration.lifecycle import all_gone, descendants, run_segments, start, steps, wait_for_step


def test_kill9_supervisor_children_die_and_next_run_sweeps(tmp_path):
    proc = start(tmp_path, "run.total_steps=40", "run.checkpoint_every=5",
                 "actor.sim.step_time_s=0.08")
    wait_for_step(proc, tmp_path, 12)
    children = descendants(proc.pid)
    assert len(children) >= 3
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    # the dead run's segments are still there (checked at once: any launch's startup sweeps the
    # segments of dead runs, a parallel test's too)
    assert run_segments(proc) != []
    assert all_gone(children, timeout=5.0) == []
    again = start(tmp_path, "run.total_steps=40", "run.resume=must")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert run_segments(proc, again) == []          # swept at startup, own ones unlinked at exit
    s = steps(tmp_path)
    assert [r["step"] for r in s] == list(range(1, 41))
    first = [r for r in s if r["resumed"]][0]
    assert first["admitted"] <= 3 * 8
