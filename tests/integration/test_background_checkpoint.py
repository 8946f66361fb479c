"""Checkpoints off the critical path: the trainer snapshots its state and writes it in the
background while the next batches train (the supervisor no longer holds the next batch for a save),
and what it writes is exactly the state of the step it names."""
import json
import os

import torch

from orchestrator.run import checkpoint
from tests.integration.lifecycle import run, steps


def test_steps_train_while_a_slow_checkpoint_is_written(tmp_path):
    """The sim trainer takes 0.5 s to write each checkpoint, a step takes 0.02 s: steps train during
    the writes, every checkpoint still commits, and the run resumes from the last one."""
    common = ["run.checkpoint_every=5", "actor.sim.save_time_s=0.5", "actor.sim.step_time_s=0.02",
              "inference.sim.latency_s=0.01", "run.keep_checkpoints=10"]
    out = run(tmp_path, "run.total_steps=20", *common)
    assert out.returncode == 0, out.stderr
    s = steps(tmp_path)
    during = [r["step"] for r in s if r.get("train_saving")]
    assert len(during) >= 5                       # at least one step trained during each save
    assert sorted(k for k, _ in checkpoint.committed(str(tmp_path))) == [5, 10, 15, 20]
    out = run(tmp_path, "run.total_steps=25", *common, "run.resume=must")
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 26))


def test_torch_checkpoint_holds_exactly_its_steps_weights(tmp_path):
    """Replaying the persisted batches 1..k through a fresh trainer gives the weights each
    background checkpoint k holds, bit for bit: the snapshot is step k's state, not a later one."""
    from orchestrator.backends.torch_trainer import TorchTrainer, read_weights
    from orchestrator.config import load_config
    from orchestrator.run.durable import read_record
    from shm.codec import decode

    out = run(tmp_path, "run.total_steps=12", "run.checkpoint_every=4", "eval.every_steps=0",
              "run.keep_checkpoints=5", "run.progress=false", config="configs/default.yaml",
              timeout=300)
    assert out.returncode == 0, out.stderr
    cfg = load_config(os.path.join(tmp_path, "config.yaml"))
    torch.set_num_threads(cfg.actor.threads)
    tr = TorchTrainer(cfg.model, cfg.actor, cfg.task, seed=cfg.run.seed,
                      temperature=cfg.rollout.temperature, total_steps=cfg.run.total_steps)
    for k in range(1, 13):
        tr.train_step(decode(read_record(str(tmp_path / "batches" / f"step_{k:08d}.rec"))))
        if k % 4 == 0:
            saved = read_weights(str(tmp_path / "checkpoints" / f"step_{k:08d}" / "trainer"))
            for name, p in tr.module.named_parameters():
                assert torch.equal(saved[name], p.detach()), (k, name)
            state = torch.load(tmp_path / "checkpoints" / f"step_{k:08d}" / "trainer" / "optimizer.pt",
                               weights_only=True)
            assert state["steps"] == k
            assert json.loads((tmp_path / "checkpoints" / f"step_{k:08d}" / "supervisor.json")
                              .read_text())["step"] == k
