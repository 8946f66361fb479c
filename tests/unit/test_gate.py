"""StalenessGate: AReaL's capacity formula, counters, recovery, state round-trip, thread safety."""
import threading

import pytest

from orchestrator.loop.gate import StalenessGate


def make(S=2, B=8, C=64, v=0):
    cell = [v]
    return StalenessGate(S, B, C, version=lambda: cell[0]), cell


def admit(g, n):
    for _ in range(n):
        g.on_enqueued()
        g.on_submitted()


def test_initial_capacity_is_pending_limit_when_concurrency_is_ample():
    for S in (0, 1, 2, 4):
        g, _ = make(S=S, C=10**6)
        assert g.capacity() == g.pending_limit() == (S + 1) * 8


def test_concurrency_binds_first():
    g, _ = make(S=4, B=8, C=12)
    assert g.capacity() == 12
    admit(g, 5)
    assert g.capacity() == 7


def test_staleness_term_counts_accepted_and_running():
    g, cell = make(S=1, B=4, C=100)
    admit(g, 8)
    assert g.capacity() == 0
    for _ in range(4):
        g.on_accepted()
    assert g.capacity() == 0          # accepted still occupies staleness budget
    cell[0] = 1                       # a version bump opens exactly one batch
    assert g.capacity() == 4


def test_rejection_frees_staleness_capacity():
    g, _ = make(S=0, B=4, C=100)
    admit(g, 4)
    assert g.capacity() == 0
    g.on_rejected()
    assert g.capacity() == 1
    g.on_accepted()
    assert g.capacity() == 1
    assert g.stats() == {"enqueued": 0, "running": 2, "accepted": 1, "rejected": 1}


def test_capacity_may_be_negative():
    g, cell = make(S=0, B=4, C=100, v=3)
    admit(g, 16)
    cell[0] = 0
    assert g.capacity() == 4 - 16


def test_enqueued_then_submitted_moves_counter():
    g, _ = make()
    g.on_enqueued()
    g.on_enqueued()
    assert g.stats()["enqueued"] == 2
    g.on_submitted()
    assert g.stats() == {"enqueued": 1, "running": 1, "accepted": 0, "rejected": 0}


def test_version_recovered_closes_resume_burst():
    g, _ = make(S=2, B=8, C=10**6, v=40)
    assert g.capacity() == 344            # the unbounded burst the reference warns about
    g.on_version_recovered(40)
    assert g.capacity() == 24 == g.pending_limit()


def test_version_recovered_rejects_negative():
    g, _ = make()
    with pytest.raises(ValueError):
        g.on_version_recovered(-1)


def test_state_dict_round_trip():
    g, _ = make(S=3, B=2, C=9)
    admit(g, 5)
    g.on_accepted()
    g.on_rejected()
    g.on_enqueued()
    h, _ = make(S=3, B=2, C=9)
    h.load_state_dict(g.state_dict())
    assert h.stats() == g.stats() and h.capacity() == g.capacity()


def test_bad_parameters_raise():
    with pytest.raises(ValueError):
        StalenessGate(-1, 8, 8, version=lambda: 0)
    with pytest.raises(ValueError):
        StalenessGate(1, 0, 8, version=lambda: 0)


def test_concurrent_admission_never_overshoots():
    """Threads that claim a slot under check-then-act against a shared lock never exceed capacity."""
    g, cell = make(S=1, B=16, C=1000)
    claim = threading.Lock()
    admitted = []

    def worker():
        n = 0
        while True:
            with claim:
                if g.capacity() <= 0:
                    break
                g.on_enqueued()
                g.on_submitted()
            n += 1
        admitted.append(n)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(admitted) == 32 == g.stats()["running"]


def test_counters_consistent_under_concurrent_updates():
    g, _ = make(S=10**6, B=1, C=10**9)
    per = 2000

    def worker(i):
        for k in range(per):
            g.on_enqueued()
            g.on_submitted()
            (g.on_accepted if (k + i) % 3 else g.on_rejected)()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    s = g.stats()
    assert s["running"] == 0 and s["enqueued"] == 0
    assert s["accepted"] + s["rejected"] == 6 * per
