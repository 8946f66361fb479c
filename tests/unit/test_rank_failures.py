"""How the run names the cause when trainer ranks fail together."""
import os

from orchestrator.runtime.liveness import Overdue
from orchestrator.runtime.rank_failures import cause, collective_error, free_port, hang_message, proc_state

GLOO = ("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:421")


def test_a_rank_killed_without_a_word_is_the_cause():
    assert cause({0: GLOO}, {0: (10, 1), 1: (11, -9)}, 0).startswith("trainer rank 1 (pid 11) died "
                                                                     "with exit code -9")


def test_an_own_error_beats_a_failed_collective():
    got = cause({0: GLOO, 1: "ValueError: bad batch"}, {0: (10, 1), 1: (11, 1)}, 0)
    assert got == "trainer rank 1 failed: ValueError: bad batch"
    assert cause({0: GLOO, 1: GLOO}, {}, 1).startswith("trainer rank 1 failed") and collective_error(GLOO)


def _progress(s: float) -> Overdue:
    return Overdue(s, "progress", "actor.heartbeat_timeout_s", 3.0)


def test_hang_names_stopped_ranks_else_every_silent_one():
    assert hang_message({0: _progress(3.2), 1: _progress(3.5)}, [1]).startswith(
        "trainer rank 1 made no progress for 3.5s (actor.heartbeat_timeout_s=3)")
    msg = hang_message({0: _progress(3.2), 1: _progress(3.5)}, [])
    assert msg.startswith("trainer ranks 0, 1 made no progress") and "waiting in a collective" in msg
    stopped = hang_message({1: Overdue(31.0, "liveness", "actor.liveness_timeout_s", 30.0)}, [1])
    assert stopped.startswith("trainer rank 1 stopped answering for 31.0s (actor.liveness_timeout_s=30")


def test_process_state_and_a_free_port():
    assert proc_state(os.getpid()) in ("R", "S") and proc_state(2 ** 30) == ""
    assert 0 < free_port() < 65536
