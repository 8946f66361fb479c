"""Per-token version stamps: head, tail, RLE over loss-masked tokens; ages use the head."""
import numpy as np

from orchestrator.algo.stamp import age_summary, stamp, token_ages


def test_partial_rollout_spans_versions():
    versions = np.array([-1, -1, 3, 3, 4, 4, 4, 5], np.int32)
    mask = np.array([0, 0, 1, 1, 1, 1, 1, 1], np.uint8)
    st = stamp(versions, mask)
    assert (st.head, st.tail) == (3, 5)
    assert st.rle == ((3, 2), (4, 3), (5, 1))
    assert st.spans_versions


def test_unmasked_tokens_do_not_count():
    versions = np.array([1, 2, 2, 9], np.int32)
    mask = np.array([0, 1, 1, 0], np.uint8)
    st = stamp(versions, mask)
    assert (st.head, st.tail, st.rle) == (2, 2, ((2, 2),))
    assert not st.spans_versions


def test_replayed_rollout_has_no_stamp_and_no_age():
    versions = np.full(5, -1, np.int32)
    mask = np.ones(5, np.uint8)
    assert stamp(versions, mask) is None
    assert token_ages(7, versions, mask).size == 0
    assert age_summary(token_ages(7, versions, mask))["age_max"] is None


def test_ages_measured_from_train_version_over_live_tokens():
    versions = np.array([-1, 3, 3, 5, -1, 4], np.int32)
    mask = np.array([0, 1, 1, 1, 1, 1], np.uint8)
    ages = token_ages(6, versions, mask)
    assert sorted(ages.tolist()) == [1, 2, 3, 3]
    s = age_summary(ages)
    assert s["age_max"] == 3 and abs(s["age_mean"] - 2.25) < 1e-9 and s["age_p99"] <= 3


def test_sequence_stamps_agree_with_stamp_on_every_sequence():
    from orchestrator.algo.stamp import sequence_stamps
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 30, size=400)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    versions = rng.integers(0, 6, size=offsets[-1]).astype(np.int32)
    versions[rng.random(offsets[-1]) < 0.02] = -1                  # a few not live
    for i in range(0, 400, 7):                                     # whole replayed sequences
        versions[offsets[i]:offsets[i + 1]] = -1
    mask = (rng.random(offsets[-1]) < 0.7).astype(np.uint8)
    mask[offsets[5]:offsets[6]] = 0                                # no loss-masked token
    heads, tails, live = sequence_stamps(offsets, versions, mask)
    for i in range(400):
        st = stamp(versions[offsets[i]:offsets[i + 1]], mask[offsets[i]:offsets[i + 1]])
        assert live[i] == (st is not None)
        if st is not None:
            assert (heads[i], tails[i]) == (st.head, st.tail)
    assert sequence_stamps(np.zeros(1, np.int64), versions[:0], mask[:0])[2].size == 0
