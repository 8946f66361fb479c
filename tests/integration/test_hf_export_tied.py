"""Issue #22 item 17: a checkpoint's `trainer/hf/` stores a tied embedding once, as transformers
does (`model.export_hf`'s contract): the snapshot's copy of the weights used to break the tie, so
`hf/` held `lm_head.weight` too, and resuming from it failed ("unexpected ['lm_head.weight']").
One rank and two FSDP2 ranks (the gathered full weights rank 0 exports); real saves, real files."""
import os
import sys

import pytest
import torch

from orchestrator.backends.torch_trainer import TorchTrainer
from orchestrator.config import ActorConfig, ModelConfig, TaskConfig
from orchestrator.runtime.rank_failures import free_port, rendezvous_env
from tests.hf_model import build_hf_model_dir
from tests.integration.lifecycle import start_ranks


def _trainer(model_dir, actor=None, group=None) -> TorchTrainer:
    return TorchTrainer(ModelConfig(path=str(model_dir)), ActorConfig(backend="torch", lr=1e-2,
                        **(actor or {})), TaskConfig(name="copy2"), seed=0, group=group)


def _check_tied_export(ckpt, embed: torch.Tensor) -> None:
    """hf/ has no lm_head.weight; transformers loads it tied, with the trained embedding."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    hf = os.path.join(ckpt, "hf")
    names = set()
    for f in os.listdir(hf):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(hf, f), "pt") as st:
                names |= set(st.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names, sorted(names)
    model = AutoModelForCausalLM.from_pretrained(hf)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.model.embed_tokens.weight, embed)


def _train_once(tr) -> None:
    from tests.integration.test_trainer_ranks import make_batch

    assert tr.train_step(make_batch())["skipped"] == 0


def test_one_rank_stores_a_tied_embedding_once_and_resumes(tmp_path, hf_model_dir):
    source = hf_model_dir                 # the session's model directory, read only
    tr = _trainer(source)
    _train_once(tr)
    ckpt = str(tmp_path / "ckpt")
    tr.save(ckpt)
    embed = tr.module.model.embed_tokens.weight.detach().clone()
    _check_tied_export(ckpt, embed)
    again = _trainer(source)
    again.load(ckpt)                              # refused before: "unexpected ['lm_head.weight']"
    assert torch.equal(again.module.model.embed_tokens.weight, embed)
    assert again.module.lm_head.weight.data_ptr() == again.module.model.embed_tokens.weight.data_ptr()


def _rank_save(rank, world, port, model_dir, ckpt, embed_path):
    from orchestrator.backends.sharding import RankGroup
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(1)
    actor = {"num_ranks": world, "sharding": "fsdp"}
    tr = _trainer(model_dir, actor, RankGroup.from_env(
        ActorConfig(backend="torch", **actor), torch.device("cpu")))
    _train_once(tr)
    tr.save(ckpt)
    from orchestrator.backends import sharding
    full = sharding.full_state(tr.model)
    if rank == 0:
        torch.save(full["model.embed_tokens.weight"], embed_path)
    tr.group.barrier()
    tr.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)        # as trainer workers do: gloo's native threads may abort at finalization


@pytest.mark.slow          # two spawned ranks (~20 s idle); the one-rank test covers export_hf
def test_fsdp_ranks_store_a_tied_embedding_once(tmp_path):
    source = build_hf_model_dir(tmp_path / "model")
    ckpt, embed = str(tmp_path / "ckpt"), str(tmp_path / "embed.pt")
    start_ranks(_rank_save, (2, free_port(), str(source), ckpt, embed), 2)
    _check_tied_export(ckpt, torch.load(embed))


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
