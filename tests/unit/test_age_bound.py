"""AgeBound: floors of rollouts in flight from the weights sent on each ring, which ones are doomed,
finished groups too old for a batch, late results of aborted requests."""
import numpy as np

from orchestrator.loop.age_bound import AgeBound
from shm.codec import Sequences


def group(ident, versions, mask=None):
    v = np.asarray(versions, np.int32)
    mask = np.ones(len(v), np.uint8) if mask is None else np.asarray(mask, np.uint8)
    return Sequences(kind=0, ident=ident, version=-1, offsets=np.array([0, len(v)], np.int64),
                     prompt_lens=np.zeros(1, np.int32), prompt_ids=np.zeros(1, np.int64),
                     tokens=np.zeros(len(v), np.int32), logprobs=np.zeros(len(v), np.float32),
                     versions=v, loss_mask=mask, rewards=np.zeros(1, np.float32),
                     advantages=np.zeros(1, np.float32), scalars=np.zeros(0))


def test_floor_is_the_last_load_sent_on_the_ring():
    b = AgeBound(2, workers=2, version=0)
    b.dispatched(1, 0)
    b.weights_sent([0, 1], 3)
    b.dispatched(2, 0)
    b.dispatched(3, 1)
    assert b.floor == {1: 0, 2: 3, 3: 3}
    assert b.doomed(2) == [] and b.doomed(3) == [1]        # 0 < 3 - 2: can no longer meet it
    assert b.doomed(6) == [2, 3] and b.floor == {}
    assert b.take_counts() == {"aborted": 3, "dropped": 0, "wasted_tokens": 0, "aborts_pending": 3}
    assert b.take_counts()["aborted"] == 0


def test_restart_resets_the_floor():
    b = AgeBound(1, workers=1, version=0)
    b.weights_sent([0], 5)
    b.restarted(0, 2)           # a fresh process serves from the version it is told to load
    b.dispatched(7, 0)
    assert b.floor[7] == 2


def test_finished_groups_judged_by_their_oldest_live_token():
    b = AgeBound(2, workers=1, version=0)
    assert not b.too_old(group(1, [5, 6, 7]), 7)
    assert b.too_old(group(2, [4, 7, 7], [0, 1, 1]), 10)
    assert not b.too_old(group(3, [4, 9, 9], [0, 1, 1]), 10)    # the old token is not loss-masked
    assert not b.too_old(group(4, [-1, -1]), 100)              # replayed: no age
    assert b.take_counts() == {"aborted": 0, "dropped": 1, "wasted_tokens": 2, "aborts_pending": 0}


def test_late_result_of_an_aborted_request_is_wasted():
    b = AgeBound(0, workers=1, version=0)
    b.dispatched(9, 0)
    assert b.doomed(1) == [9]
    assert b.late_result(group(9, [0, 0, 0]))
    assert not b.late_result(group(9, [0, 0, 0]))           # once
    assert not b.late_result(group(10, [1]))
    assert b.take_counts()["wasted_tokens"] == 3


def test_an_aborted_request_is_released_when_it_ends():
    """Whichever comes first of the worker's answer and the late result; with nothing sent, the
    answer alone ends it; a worker's death ends all of its own."""
    b = AgeBound(0, workers=2, version=0)
    for rid, w in ((1, 0), (2, 0), (3, 0), (4, 1), (5, 1)):
        b.dispatched(rid, w)
    assert b.doomed(1) == [1, 2, 3, 4, 5] and b.pending_aborts() == 5
    b.abort_done(1, result_sent=False)                      # stopped: nothing will come
    b.abort_done(2, result_sent=True)                       # answer first, then the result
    assert b.pending_aborts() == 4 and b.late_result(group(2, [0]))
    assert b.late_result(group(3, [0, 0])) and b.pending_aborts() == 3    # result first
    assert not b.late_result(group(3, [0, 0]))              # counted once
    b.abort_done(3, result_sent=True)
    assert b.pending_aborts() == 2 and not b.late_result(group(3, [0]))
    b.worker_lost(1)                                        # 4 and 5 never answer
    assert b.pending_aborts() == 0 and b.aborted_ids == {} and b.floor == {} and b.worker == {}
    assert b.take_counts()["wasted_tokens"] == 3


def test_admission_waits_while_no_worker_could_meet_the_bound():
    b = AgeBound(1, workers=2, version=0)
    assert b.can_start(1, [0, 1]) and not b.can_start(2, [0, 1])
    b.weights_sent([1], 1)
    assert b.can_start(2, [0, 1]) and not b.can_start(2, [0])   # only a live worker counts
