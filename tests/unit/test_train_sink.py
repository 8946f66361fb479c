"""Train sink: GRPO advantages, zero-std filtering, batches of B groups in completion order."""
import numpy as np

from orchestrator.loop.train_sink import TrainSink
from shm.codec import Sequences, decode, encode


def group(rid, rewards, ntok=3, version=0):
    n = len(rewards)
    L = 2 + ntok
    return Sequences(
        kind=0, ident=rid, version=-1, offsets=np.arange(n + 1, dtype=np.int64) * L,
        prompt_lens=np.full(n, 2, np.int32), prompt_ids=np.full(n, rid, np.int64),
        tokens=np.arange(n * L, dtype=np.int32), logprobs=np.zeros(n * L, np.float32),
        versions=np.tile(np.r_[[-1, -1], [version] * ntok], n).astype(np.int32),
        loss_mask=np.tile(np.r_[[0, 0], [1] * ntok], n).astype(np.uint8),
        rewards=np.asarray(rewards, np.float32), advantages=np.zeros(n, np.float32),
        scalars=np.zeros(0))


def roundtrip(g):
    return decode(bytes(encode(g)))       # read-only views, as they come off a ring


def test_grpo_advantages_per_group_and_zero_std_filter():
    sink = TrainSink(batch_size=3, filter_zero_std=True)
    for rid, r in enumerate([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]]):
        sink.add(roundtrip(group(rid, r)))
    assert sink.ready()
    batch, info = sink.take_batch(step=1, version=0)
    assert info.groups == 3 and info.trainable == 8 and batch.n == 8
    assert batch.ident == 1 and batch.version == 0
    a = batch.advantages
    np.testing.assert_allclose(a[:4], [1, -1, -1, 1], atol=1e-4)
    assert abs(a[4:].sum()) < 1e-4
    assert a[7] > 0 > a[4]
    assert info.consumed.n == 12                     # age stats see everything consumed
    assert abs(info.reward_mean - 7 / 12) < 1e-6
    assert not sink.ready() and sink.pending == []


def test_filter_off_keeps_constant_groups_with_zero_advantage():
    sink = TrainSink(batch_size=1, filter_zero_std=False)
    sink.add(group(0, [1, 1]))
    batch, info = sink.take_batch(1, 0)
    assert info.trainable == 2 and np.all(batch.advantages == 0)


def test_singleton_groups_use_batch_baseline():
    sink = TrainSink(batch_size=4, filter_zero_std=True)
    for rid, r in enumerate([1, 0, 0, 1]):
        sink.add(group(rid, [r]))
    batch, info = sink.take_batch(1, 0)
    assert info.trainable == 4
    np.testing.assert_allclose(batch.advantages, [1, -1, -1, 1], atol=1e-4)


def test_all_equal_batch_is_empty_after_filtering():
    sink = TrainSink(batch_size=2, filter_zero_std=True)
    sink.add(group(0, [0]))
    sink.add(group(1, [0]))
    batch, info = sink.take_batch(5, 4)
    assert info.trainable == 0 and batch.n == 0
    assert decode(bytes(encode(batch))).n == 0       # an empty batch still encodes


def test_completion_order_is_kept_across_batches():
    sink = TrainSink(batch_size=2, filter_zero_std=False)
    for rid in (7, 3, 9, 1):
        sink.add(group(rid, [rid % 2, 1 - rid % 2]))
    b1, _ = sink.take_batch(1, 0)
    b2, _ = sink.take_batch(2, 1)
    assert list(b1.prompt_ids[::2]) == [7, 3] and list(b2.prompt_ids[::2]) == [9, 1]
