"""Rewards filled in by the inference worker: numpy scalars are valid; a reward function that raises
or returns a non-finite or non-numeric value is bad environment output naming the task and the
prompt (the worker's Fatal line starts with BadEnvOutput: the run exits 2)."""
import numpy as np
import pytest

from orchestrator.inference_worker import BadEnvOutput, _fill_rewards
from shm.codec import Sequences


class Task:
    name = "mytask"

    def __init__(self, value):
        self.value = value

    def reward(self, prompt_id, completion, eval):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def _group():
    return Sequences.build(0, 1, 0, [{"prompt": [1, 2], "completion": [3, 4], "prompt_id": 7}] * 2)


@pytest.mark.parametrize("value", [1, 0.5, np.float32(0.25), np.float64(1.0), np.int64(1)])
def test_numbers_and_numpy_scalars_are_rewards(value):
    g = _group()
    _fill_rewards(g, Task(value), False)
    assert g.rewards.tolist() == [float(value)] * 2


@pytest.mark.parametrize("value, needle", [
    (float("nan"), "nan"), (np.float32("inf"), "inf"), (True, "True"), ("1", "'1'"),
    (None, "None"), (KeyError("answer"), "raised"),
])
def test_bad_rewards_name_the_task_and_prompt(value, needle):
    with pytest.raises(BadEnvOutput) as info:
        _fill_rewards(_group(), Task(value), False)
    msg = str(info.value)
    assert "'mytask'" in msg and "prompt 7" in msg and needle in msg and "\n" not in msg
