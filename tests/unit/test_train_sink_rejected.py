"""A sample with no loss-masked token (a multi-turn episode rejected by the append rule) is not
trained: it takes no part in its group's advantage baseline, gets advantage 0 and is not counted
trainable, yet its group stays in the batch, so its prompt is consumed exactly once."""
import numpy as np

from orchestrator.loop.train_sink import TrainSink
from tests.unit.test_train_sink import group, roundtrip


def _rejected(g, *rows):
    """The group with rows `rows` turned into rejected episodes (every token context)."""
    mask = np.array(g.loss_mask)
    for i in rows:
        mask[g.seq(i)] = 0
    g.loss_mask = mask
    return g


def test_rejected_samples_are_out_of_the_baseline():
    sink = TrainSink(batch_size=2, filter_zero_std=False)
    sink.add(roundtrip(_rejected(group(0, [1, 0, 0.5, 0]), 3)))
    sink.add(roundtrip(_rejected(group(1, [0, 0]), 0, 1)))        # every episode rejected
    batch, info = sink.take_batch(step=1, version=0)
    assert batch.n == 6 and batch.prompt_ids.tolist() == [0, 0, 0, 0, 1, 1]   # consumed once, kept
    r = np.array([1, 0, 0.5])
    np.testing.assert_allclose(batch.advantages[:3], (r - r.mean()) / r.std(), atol=1e-4)
    assert batch.advantages[3:].tolist() == [0, 0, 0]
    assert info.trainable == 3 and info.trainable_tokens == 9


def test_zero_std_filter_looks_at_trained_samples_only():
    sink = TrainSink(batch_size=2, filter_zero_std=True)
    sink.add(roundtrip(_rejected(group(0, [1, 1, 0]), 2)))       # the trained ones agree: no signal
    sink.add(roundtrip(group(1, [1, 0])))
    batch, info = sink.take_batch(step=1, version=0)
    assert batch.prompt_ids.tolist() == [1, 1] and info.trainable == 2


def test_singleton_baseline_skips_rejected_samples():
    sink = TrainSink(batch_size=3, filter_zero_std=True)
    for rid, r in enumerate([1, 0, 0]):
        g = group(rid, [r])
        sink.add(roundtrip(_rejected(g, 0) if rid == 2 else g))
    batch, info = sink.take_batch(step=1, version=0)
    np.testing.assert_allclose(batch.advantages, [1, -1, 0], atol=1e-4)
    assert info.trainable == 2
