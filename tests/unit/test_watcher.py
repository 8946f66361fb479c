"""Weight watcher: publish -> reload on every live worker -> version bump; stalls raise."""
import pytest

from orchestrator.loop.watcher import WeightSyncStall, WeightWatcher


class Counter:
    def __init__(self):
        self.v = 0

    def get(self):
        return self.v

    def set(self, v):
        self.v = v


def make(timeout=5.0):
    published = [0]
    now = [0.0]
    c = Counter()
    w = WeightWatcher(lambda: published[0], c, timeout, clock=lambda: now[0])
    return w, c, published, now


def test_version_bumps_only_after_every_worker_acks():
    w, c, pub, _ = make()
    assert w.poll([0, 1]) is None
    pub[0] = 1
    assert w.poll([0, 1]) == 1
    assert w.poll([0, 1]) is None              # one sync at a time
    assert w.on_ack(0, 1) is None and c.v == 0
    assert w.on_ack(1, 1) is not None and c.v == 1


def test_stale_ack_ignored_and_newer_ack_counts():
    w, c, pub, _ = make()
    pub[0] = 2
    assert w.poll([0]) == 2
    assert w.on_ack(0, 1) is None and c.v == 0
    assert w.on_ack(0, 3) is not None and c.v == 2


def test_stall_raises_with_a_clear_message():
    w, c, pub, now = make(timeout=5.0)
    pub[0] = 1
    w.poll([0, 1])
    w.on_ack(0, 1)
    now[0] = 6.0
    with pytest.raises(WeightSyncStall, match=r"version 1 .*\[1\].*sync_timeout_s"):
        w.poll([0, 1])


def test_dead_worker_is_forgotten():
    w, c, pub, _ = make()
    pub[0] = 1
    w.poll([0, 1])
    w.on_ack(0, 1)
    assert w.forget_worker(1) is not None and c.v == 1
