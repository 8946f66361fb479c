"""Dispatcher over real rings: least-loaded submission, pause/resume, full rings, dead workers."""
import pytest

from orchestrator import messages
from orchestrator.wire import recv
from orchestrator.loop.dispatcher import Dispatcher
from shm.ring import Ring
from tests.segments import test_segment


@pytest.fixture
def rings():
    rs = [Ring.create(test_segment(f"d{i}"), 4096) for i in range(2)]
    yield rs
    for r in rs:
        r.close()
        r.unlink()


def gen(rid):
    return messages.Generate(request_id=rid, prompt_id=rid, prompt_tokens=[1, 2], n=1,
                             max_new_tokens=4, temperature=1.0)


def test_least_loaded_round_robin_and_finish(rings):
    d = Dispatcher(rings, queue_size=16)
    for rid in range(4):
        d.enqueue(gen(rid))
    assert [m.request_id for m in d.pump()] == [0, 1, 2, 3]
    assert d.load == [2, 2]
    got = [recv(rings[0]).request_id, recv(rings[0]).request_id]
    assert got == [0, 2]
    assert d.finished(0, "g0").request_id == 0 and d.load == [1, 2]
    assert d.finished(0, "again") is None
    assert list(d.out_queue) == ["g0"]


def test_pause_holds_prompts_in_the_in_queue(rings):
    d = Dispatcher(rings, queue_size=16)
    d.pause()
    d.enqueue(gen(1))
    assert d.pump() == [] and len(d.in_queue) == 1
    d.resume()
    assert [m.request_id for m in d.pump()] == [1]


def fill(d):
    """Pump prompts 0, 1, ... until no live worker's ring takes one more; how many it took."""
    n = 0
    while True:
        d.enqueue(gen(n))
        if not d.pump():
            return n
        n += 1


def test_full_ring_leaves_prompt_queued(rings):
    d = Dispatcher(rings[:1], queue_size=10**6)
    assert fill(d) > 10 and len(d.in_queue) == 1


def test_dead_worker_returns_its_inflight(rings):
    d = Dispatcher(rings, queue_size=16)
    for rid in range(4):
        d.enqueue(gen(rid))
    d.pump()
    lost = d.mark_dead(1)
    assert sorted(m.request_id for m in lost) == [1, 3]
    d.enqueue(gen(9))
    assert [m.request_id for m in d.pump()] == [9] and d.load[0] == 3


def test_control_never_waits_on_a_full_ring_and_keeps_ring_order(rings):
    """A stalled worker's ring fills up: an Abort or LoadWeights for it returns at once, waits in
    its outbox, and reaches the ring ahead of any later prompt; other workers are unaffected."""
    d = Dispatcher(rings, queue_size=10**6)
    d.live[1] = False                         # fill worker 0's ring to the brim
    fill(d)
    d.in_queue.clear()
    d.control(0, messages.Abort(request_id=0))          # returns without waiting
    d.broadcast(messages.LoadWeights(version=7))
    assert [type(m).__name__ for m in d.outbox[0]] == ["Abort", "LoadWeights"]
    d.live[1] = True
    d.enqueue(gen(10**6))
    d.enqueue(gen(10**6 + 1))
    assert [m.request_id for m in d.pump()] == [10**6, 10**6 + 1]    # both to worker 1
    assert d.inflight[10**6][0] == 1 and d.inflight[10**6 + 1][0] == 1
    got = [recv(rings[0]) for _ in range(3)]            # the worker reads again: room on its ring
    assert [m.request_id for m in got] == [0, 1, 2]
    d.enqueue(gen(10**6 + 2))
    d.load[1] = 10**9                                   # worker 0 is the least loaded now
    d.pump()
    rest = []
    while (m := recv(rings[0])) is not None:
        rest.append(m)
    names = [type(m).__name__ for m in rest]
    assert names[-3:] == ["Abort", "LoadWeights", "Generate"] and rest[-1].request_id == 10**6 + 2
    assert names[:-3] == ["Generate"] * (len(rest) - 3) and not d.outbox[0]


def test_a_dead_workers_outbox_is_dropped(rings):
    d = Dispatcher(rings, queue_size=16)
    while True:
        try:
            rings[0].put(b"x" * 512, timeout=0.0)
        except TimeoutError:
            break
    d.control(0, messages.Abort(request_id=3))
    assert len(d.outbox[0]) == 1 and d.depths()["outbox"] == 1
    d.mark_dead(0)
    assert not d.outbox[0] and d.flush() == 0
