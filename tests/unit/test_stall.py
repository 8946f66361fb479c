"""loop.stall: the idle state must hold for the whole bound, without a break, to fail the run."""
import pytest

from orchestrator.errors import RunFailed
from orchestrator.loop.stall import StallGuard


def guard(bound=5.0):
    now = [0.0]
    return StallGuard(bound, clock=lambda: now[0]), now


def test_idle_for_the_bound_fails_the_run_saying_where_it_stood():
    g, now = guard()
    for t in (0.0, 2.0, 4.9):
        now[0] = t
        g.check(True, lambda: "built 20")
    now[0] = 5.0
    with pytest.raises(RunFailed, match=r"stalled.*5 s \(run.stall_timeout_s=5\).*built 20") as e:
        g.check(True, lambda: "built 20")
    assert e.value.exit_code == 1


def test_one_busy_turn_restarts_the_count():
    g, now = guard()
    g.check(True, str)
    now[0] = 4.0
    g.check(False, str)
    for t in (4.5, 9.0):
        now[0] = t
        g.check(True, str)
    now[0] = 9.6
    with pytest.raises(RunFailed):
        g.check(True, str)


def test_the_key_is_bounded():
    from orchestrator.config import load_config
    assert load_config(None, []).run.stall_timeout_s == 300.0
    with pytest.raises(Exception, match="stall_timeout_s"):
        load_config(None, ["run.stall_timeout_s=0"])
