"""The logprob mismatch metric (issue #10 item 2): the trainer reports mean/max |recomputed -
behaviour| logprob over tokens sampled by the weights it holds; an inference engine that did not
load the published weights (the stale-weights fault) shows up there, and actor.logprob_diff_limit
fails the run on it."""
import numpy as np
import pytest

from orchestrator.backends.base import GenRequest
from orchestrator.config import ActorConfig, InferenceConfig, ModelConfig, RolloutConfig, TaskConfig
from orchestrator.errors import RunFailed
from orchestrator.loop.step_lines import check_mismatch
from shm.codec import concat
from tests.workload import DigitTask

pytest.importorskip("torch")


def _setup():
    from orchestrator.backends.torch_inference import TorchInference
    from orchestrator.backends.torch_trainer import TorchTrainer
    mc, tc = ModelConfig(), TaskConfig(name="copy2")
    inf = TorchInference(mc, tc, RolloutConfig(), InferenceConfig(backend="torch", max_batch=64), seed=5)
    tr = TorchTrainer(mc, ActorConfig(backend="torch", lr=3e-2), tc, seed=5)
    return inf, tr, DigitTask("copy2", 5)


def _batch(inf, task, start, version):
    for k in range(4):
        pid, prompt = task.train_prompt(start + k)
        inf.add(GenRequest(start + k, pid, prompt, 8, 4, 1.0))
    groups = []
    while inf.num_active():
        groups += [r.sequences for r in inf.step(0.0)]
    for g in groups:
        g.advantages[:] = np.arange(g.n) % 2 - 0.5
    return concat(groups, kind=2, ident=version + 1, version=version)


def test_fresh_weights_agree_and_stale_weights_are_caught():
    inf, tr, task = _setup()
    first = tr.train_step(_batch(inf, task, 0, 0))
    assert first["logprob_diff_max"] < 1e-4 and first["logprob_diff_tokens"] > 0
    # the trainer now holds version 1; inference still samples with version 0 but stamps 1
    stale = _batch(inf, task, 10, 1)
    stale.versions[stale.versions >= 0] = 1
    caught = tr.train_step(stale)
    assert caught["logprob_diff_mean"] > 1e-3, caught
    # inference loads the published weights: agreement again
    buf = memoryview(bytearray(tr.weight_nbytes()))
    tr.write_weights(buf)
    inf.load_weights(2, buf)
    fresh = tr.train_step(_batch(inf, task, 20, 2))
    assert fresh["logprob_diff_max"] < 1e-4
    with pytest.raises(RunFailed, match=r"actor.logprob_diff_limit=0.001") as info:
        check_mismatch(2, caught, 1e-3)
    assert info.value.exit_code == 1
    check_mismatch(3, fresh, 1e-3)           # below the limit: nothing
    check_mismatch(2, caught, None)          # no limit: reported only


def test_only_tokens_of_the_trainers_version_count():
    inf, tr, task = _setup()
    older = _batch(inf, task, 0, 3)          # sampled at version 0, trained at 3: excluded
    stats = tr.train_step(older)
    assert "logprob_diff_mean" not in stats
