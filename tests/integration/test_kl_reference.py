"""KL to a reference model (issue #24 item 4, `actor.kl_ctl`): on 2 gloo ranks (FSDP2, the
reference sharded like the actor) `kl_ref_mean` is 0 at step 1, where the policy is the reference,
and grows as the policy moves, with the same values as one rank; checkpoints hold the reference's
hash, not its weights, and a resume against another reference is refused. Real processes, a real
gloo group."""
import os
import sys

import pytest
import torch

from orchestrator.backends.torch_trainer import TorchTrainer, read_weights, weights_hash
from orchestrator.config import ActorConfig, AlgoConfig, ModelConfig, TaskConfig
from orchestrator.runtime.rank_failures import free_port, rendezvous_env
from tests.integration.lifecycle import start_ranks
from tests.integration.test_trainer_ranks import MODEL, make_batch

ACTOR = dict(backend="torch", lr=1e-2, ppo_epochs=2, entropy_coef=0.0, kl_ctl=0.1)
STEPS = 4


def _trainer(group=None, **actor):
    return TorchTrainer(ModelConfig(**MODEL), ActorConfig(**{**ACTOR, **actor}),
                        TaskConfig(name="copy2"), seed=3, group=group, algo=AlgoConfig())


def _steps(tr) -> list[dict]:
    out = []
    for i in range(STEPS):
        batch = make_batch(seed=i)
        batch.ident = i + 1
        out.append(tr.train_step(batch))
    return out


def _rank(rank, world, port, out):
    from orchestrator.backends.sharding import RankGroup
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(1)
    actor = dict(num_ranks=world, sharding="fsdp", micro_batch_tokens=30)
    tr = _trainer(RankGroup.from_env(ActorConfig(**{**ACTOR, **actor}), torch.device("cpu")), **actor)
    stats = _steps(tr)
    if rank == 0:
        torch.save(stats, out)
    tr.group.barrier()
    tr.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)     # as trainer workers do: gloo's native threads may abort at finalization


def test_kl_ref_mean_is_zero_at_step_one_and_grows_on_two_ranks(tmp_path):
    one = [s["kl_ref_mean"] for s in _steps(_trainer())]
    out = tmp_path / "rank0.pt"
    start_ranks(_rank, (2, free_port(), str(out)), 2)
    two = [s["kl_ref_mean"] for s in torch.load(out, weights_only=False)]
    for kl in (one, two):
        assert kl[0] == 0.0
        assert all(b > a for a, b in zip(kl, kl[1:])), kl
    assert two == pytest.approx(one, rel=1e-4, abs=1e-7)


def test_without_kl_nothing_changes():
    tr = _trainer(kl_ctl=0.0)
    assert tr.ref is None and "kl_ref_mean" not in tr.train_step(make_batch())


def test_checkpoint_holds_the_hash_not_the_reference(tmp_path):
    tr = _trainer()
    _steps(tr)
    tr.save(str(tmp_path / "a"))
    state = torch.load(tmp_path / "a" / "optimizer.pt", weights_only=True)
    assert state["ref_hash"] == tr.ref_hash == weights_hash(_trainer(kl_ctl=0.0).module)
    assert set(read_weights(str(tmp_path / "a"))) == {n for n, _ in tr.module.named_parameters()}
    again = _trainer()                       # the same reference (the initial weights): resumes
    again.load(str(tmp_path / "a"))
    batch = make_batch(seed=9)
    batch.ident = STEPS + 1
    want, got = tr.train_step(batch), again.train_step(batch)
    assert got["kl_ref_mean"] > 0 and (got["kl_ref_mean"], got["loss"]) == (want["kl_ref_mean"], want["loss"])
    # a reference from another directory (the trained weights): refused, naming both hashes
    other = _trainer(ref_path=str(tmp_path / "a" / "hf"))
    assert other.ref_hash != tr.ref_hash
    with pytest.raises(ValueError, match="another KL reference"):
        other.load(str(tmp_path / "a"))
    # that reference really is the trained model: the initial policy is already away from it
    assert other.train_step(make_batch())["kl_ref_mean"] > 0


def test_bf16_reference_is_allowed():
    tr = _trainer(ref_dtype="bfloat16")
    assert next(tr.ref.parameters()).dtype == torch.bfloat16
    stats = _steps(tr)
    assert stats[0]["kl_ref_mean"] < 1e-2 and stats[-1]["kl_ref_mean"] > stats[0]["kl_ref_mean"]
