"""Saved rollouts through a real checkpoint directory: each group comes back with its own scalars
(reward errors, the multi-turn episode fields), and a checkpoint written before groups carried
them still loads (its groups have none). Retention history: every commit appends its step and
run.keep_batches."""
import json
import os

import numpy as np

from orchestrator.run import checkpoint
from orchestrator.envs.base import SCALARS
from shm.codec import Sequences


def _group(ident, n, scalars):
    seqs = [{"prompt": [1, 2], "completion": [3, 4, 5][: 1 + (i % 3)], "reward": float(i % 2),
             "prompt_id": ident} for i in range(n)]
    return Sequences.build(kind=1, ident=ident, version=0, seqs=seqs, scalars=scalars)


def _write(tmp_path, step, finished, keep_batches=None):
    run_dir = str(tmp_path)
    tmp = checkpoint.begin(run_dir, step)
    checkpoint.write_state(tmp, {"step": step, "cursor": 9, "redo": [], "gate": {},
                                 "config": {"run": {"keep_batches": keep_batches}}}, finished)
    return checkpoint.commit(tmp)


def test_each_saved_group_keeps_its_scalars(tmp_path):
    a = _group(1, 4, np.arange(len(SCALARS), dtype=np.float64) + 0.5)
    b = _group(2, 2, [3.0])                     # single-turn: the reward pool's REWARD_ERRORS only
    c = _group(3, 3, [])
    path = _write(tmp_path, 4, [(7, a), (8, b), (9, c)])
    loaded = checkpoint.load_finished(path, checkpoint.validate(path))
    assert [i for i, _ in loaded] == [7, 8, 9]
    for (_, got), want in zip(loaded, (a, b, c)):
        assert got.n == want.n and np.array_equal(got.scalars, want.scalars)
        assert np.array_equal(got.tokens, want.tokens) and np.array_equal(got.rewards, want.rewards)


def test_a_checkpoint_from_before_per_group_scalars_still_loads(tmp_path):
    a, b = _group(1, 2, [5.0]), _group(2, 3, [1.0])
    tmp = checkpoint.begin(str(tmp_path), 6)
    checkpoint.write_state(tmp, {"step": 6, "cursor": 2, "redo": [], "gate": {}}, [(0, a), (1, b)])
    state_path = os.path.join(tmp, checkpoint.STATE)
    state = json.load(open(state_path))
    state["reuse"] = [entry[:2] for entry in state["reuse"]]        # the older layout: [index, n]
    open(state_path, "w").write(json.dumps(state))
    path = checkpoint.commit(tmp)
    loaded = checkpoint.load_finished(path, checkpoint.validate(path))
    assert [(i, g.n, g.scalars.size) for i, g in loaded] == [(0, 2, 0), (1, 3, 0)]


def test_every_commit_records_its_batch_retention(tmp_path):
    _write(tmp_path, 5, [], keep_batches=2)
    _write(tmp_path, 10, [], keep_batches=None)
    lines = (tmp_path / "checkpoints" / checkpoint.RETENTION).read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"step": 5, "keep_batches": 2},
                                              {"step": 10, "keep_batches": None}]
