"""DAPO's overlong handling (issue #24 item 6): the soft punishment and the cut test against
hand-computed values, the train sink applying them before the advantages (filtered completions out
of the loss and the baseline, the consumed groups untouched), the step-line counts, and the config."""
import numpy as np
import pytest

from orchestrator.algo import cut_at_limit, overlong_penalty
from orchestrator.config import ConfigError, load_config
from orchestrator.data.tokens import load_tokens
from orchestrator.loop.train_sink import Overlong, TrainSink
from shm.codec import Sequences, decode, encode

STOP = 2


def test_soft_penalty_is_dapos_linear_ramp():
    # max 10, buffer 4: free up to 6, then -1/4 per token, -1 at the limit and beyond
    got = overlong_penalty([0, 6, 7, 8, 10, 12], max_len=10, buffer_len=4)
    np.testing.assert_allclose(got, [0, 0, -0.25, -0.5, -1, -1])
    np.testing.assert_allclose(overlong_penalty([7, 10], 10, 4, factor=0.5), [-0.125, -0.5])
    np.testing.assert_allclose(overlong_penalty([3, 4], 4, 4), [-0.75, -1])     # buffer = limit
    for bad in (0, 11):
        with pytest.raises(ValueError, match="buffer_len"):
            overlong_penalty([1], 10, bad)


def test_cut_means_at_the_limit_without_a_stop_token():
    got = cut_at_limit([4, 4, 3, 5, 0], [7, STOP, 7, STOP, 7], max_len=4, stop_ids=(STOP, 9))
    assert got.tolist() == [True, False, False, False, False]
    with pytest.raises(ValueError):
        cut_at_limit([-1], [0], 4, (STOP,))


def _group(rid, completions, rewards, prompt_len=2):
    """One group; `completions` are each sample's completion token ids."""
    seqs = [[5] * prompt_len + list(c) for c in completions]
    offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    g = Sequences(kind=0, ident=rid, version=-1, offsets=offsets,
                  prompt_lens=np.full(len(seqs), prompt_len, np.int32),
                  prompt_ids=np.full(len(seqs), rid, np.int64),
                  tokens=np.concatenate(seqs).astype(np.int32),
                  logprobs=np.zeros(offsets[-1], np.float32),
                  versions=np.concatenate([[-1] * prompt_len + [0] * len(c) for c in completions]).astype(np.int32),
                  loss_mask=np.concatenate([[0] * prompt_len + [1] * len(c) for c in completions]).astype(np.uint8),
                  rewards=np.asarray(rewards, np.float32), advantages=np.zeros(len(seqs), np.float32),
                  scalars=np.zeros(0))
    return decode(bytes(encode(g)))          # read-only views, as they come off a ring


# lengths 2, 3, 4 (ends with its stop token: finished), 4 (cut); rewards 1, 1, 0, 0; max 4
MIXED = ([[7, STOP], [7, 7, STOP], [7, 7, 7, STOP], [7, 7, 7, 7]], [1, 1, 0, 0])


def _take(overlong, groups, filter_zero_std=False):
    sink = TrainSink(len(groups), filter_zero_std, "dr_grpo", overlong=overlong)
    for g in groups:
        sink.add(g)
    return sink.take_batch(step=1, version=0)


def _masked(seqs):
    return [int(np.asarray(seqs.loss_mask)[a:b].sum()) for a, b in zip(seqs.offsets[:-1], seqs.offsets[1:])]


def test_soft_penalty_shapes_the_advantages_not_the_rewards():
    batch, info = _take(Overlong(4, (STOP,), buffer_len=2), [_group(0, *MIXED)])
    # penalties 0, -0.5, -1, -1 -> shaped 1, 0.5, -1, -1, mean -0.125 (dr_grpo: no std)
    np.testing.assert_allclose(batch.advantages, [1.125, 0.625, -0.875, -0.875], atol=1e-6)
    assert info.reward_mean == 0.5 and batch.rewards.tolist() == [1, 1, 0, 0]
    assert info.episode == {"overlong_cut": 1, "overlong_penalized": 3,
                            "overlong_penalty_mean": -0.625}
    assert info.trainable == 4


def test_filter_takes_cut_completions_out_of_loss_and_baseline():
    batch, info = _take(Overlong(4, (STOP,), filter=True), [_group(0, *MIXED)])
    # the cut sample has no token left: baseline over 1, 1, 0 -> mean 2/3
    np.testing.assert_allclose(batch.advantages, [1 / 3, 1 / 3, -2 / 3, 0], atol=1e-6)
    assert _masked(batch) == [2, 3, 4, 0]
    assert _masked(info.consumed) == [2, 3, 4, 4]          # the age statistics see what was consumed
    assert info.episode == {"overlong_cut": 1, "overlong_filtered": 1}
    assert info.trainable == 3 and info.trainable_tokens == 9


def test_filter_and_penalty_together_and_a_dropped_group():
    flat = _group(1, [[7, STOP], [8, STOP]], [1, 1])       # all equal: dropped by filter_zero_std
    batch, info = _take(Overlong(4, (STOP,), filter=True, buffer_len=2), [flat, _group(0, *MIXED)],
                        filter_zero_std=True)
    # live shaped rewards 1, 0.5, -1: mean 1/6
    np.testing.assert_allclose(batch.advantages, [5 / 6, 1 / 3, -7 / 6, 0], atol=1e-6)
    assert batch.n == 4 and _masked(batch) == [2, 3, 4, 0]
    assert info.groups == 2 and info.consumed.n == 6
    assert info.episode["overlong_filtered"] == 1 and info.episode["overlong_penalized"] == 3


def test_without_overlong_keys_the_sink_and_step_line_are_unchanged():
    cfg = load_config()
    sink = TrainSink.for_config(cfg)
    assert sink.overlong is None
    sink.add(_group(0, *MIXED))
    sink.batch_size = 1
    batch, info = sink.take_batch(1, 0)
    assert info.episode == {} and _masked(batch) == [2, 3, 4, 4]


def test_config_builds_the_run_rule():
    cfg = load_config(None, ["algo.overlong_filter=true", "algo.overlong_buffer_len=1",
                             "algo.overlong_penalty_factor=0.5"])
    rule = TrainSink.for_config(cfg).overlong
    assert rule == Overlong(cfg.rollout.max_new_tokens, load_tokens(None).stop_ids, True, 1, 0.5)


@pytest.mark.parametrize("overrides,names", [
    (["algo.overlong_buffer_len=5"], ["algo.overlong_buffer_len", "rollout.max_new_tokens"]),
    (["algo.overlong_penalty_factor=2.0"], ["algo.overlong_penalty_factor", "algo.overlong_buffer_len"]),
    (["algo.overlong_filter=true", "task.name=lookup"], ["algo.overlong_filter", "task.env"]),
])
def test_refusals_name_both_keys(overrides, names):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert all(n in str(err.value) for n in names), err.value
