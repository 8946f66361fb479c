"""DAPO's dynamic sampling in the train sink: groups with equal rewards never enter a batch, ride
with the next batch built (their prompts consumed with its step), and too many in a row end the run."""
import numpy as np
import pytest

from orchestrator.config import ConfigError, load_config
from orchestrator.errors import EmptyBatches
from orchestrator.loop.train_sink import TrainSink
from tests.unit.test_train_sink import group, roundtrip


def test_equal_reward_groups_are_kept_out_and_ride_with_the_next_batch():
    sink = TrainSink(batch_size=2, filter_zero_std=False, dynamic_sampling=True)
    arrivals = [(0, [0, 0, 0, 0]), (1, [1, 0, 0, 1]), (2, [1, 1, 1, 1]), (3, [0, 1, 0, 0])]
    taken = [sink.add(roundtrip(group(rid, r))) for rid, r in arrivals]
    assert taken == [False, True, False, True]
    assert sink.ready()
    batch, info = sink.take_batch(step=1, version=0)
    assert batch.n == 8 and info.trainable == 8 and sorted(set(batch.prompt_ids.tolist())) == [1, 3]
    assert [g.ident for g in info.filtered] == [0, 2]
    assert info.episode["filtered_groups"] == 2 and info.episode["filtered_prompts"] == [0, 2]
    np.testing.assert_allclose(batch.advantages[:4], [1, -1, -1, 1], atol=1e-4)
    sink.add(roundtrip(group(4, [1, 0, 1, 0])))
    sink.add(roundtrip(group(5, [0, 1, 1, 0])))
    _, info2 = sink.take_batch(step=2, version=1)
    assert info2.filtered == [] and info2.episode["filtered_groups"] == 0


def test_a_group_whose_only_differing_sample_is_untrained_counts_as_equal():
    """Rewards are compared over samples with loss-masked tokens (a rejected episode has none)."""
    g = group(0, [1, 0, 0, 0])
    g.loss_mask[:g.offsets[1]] = 0           # the one rewarded sample is not trained
    sink = TrainSink(batch_size=1, filter_zero_std=False, dynamic_sampling=True)
    assert sink.add(g) is False


def test_too_many_filtered_in_a_row_end_the_run():
    sink = TrainSink(batch_size=2, filter_zero_std=False, dynamic_sampling=True,
                     max_consecutive_filtered=3)
    sink.add(group(0, [0, 0]))
    sink.add(group(1, [0, 1]))                # a differing group resets the count
    sink.add(group(2, [0, 0]))
    sink.add(group(3, [1, 1]))
    with pytest.raises(EmptyBatches, match="rollout.max_consecutive_filtered=3"):
        sink.add(group(4, [0, 0]))


def test_off_by_default_and_refused_for_groups_of_one():
    sink = TrainSink(batch_size=1, filter_zero_std=False)
    assert sink.add(group(0, [1, 1])) is True
    assert load_config(None, []).rollout.dynamic_sampling is False
    with pytest.raises(ConfigError, match="rollout.dynamic_sampling with rollout.group_size=1"):
        load_config(None, ["rollout.dynamic_sampling=true", "rollout.group_size=1"])
