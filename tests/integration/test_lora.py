"""LoRA in the torch trainer (issue #25 items 1-3): only the adapters train; what inference gets is
base + B x A in the base model's flat layout (equal to peft's own merge_and_unload); checkpoints
hold the adapters and their optimizer state only (a small fraction of a full one) and the base's
hash, resume bit for bit, and refuse another base, another rank or a full fine-tune; 1 rank and 2
gloo FSDP2 ranks (with micro-batches, packed) give the same loss, gradients and merged weights, and
a sharded LoRA checkpoint resumes exactly. Real processes, a real gloo group, real files."""
import copy
import faulthandler
import mmap
import os
import sys

import numpy as np
import pytest
import torch

from orchestrator.backends.model import build_model, load_flat
from orchestrator.backends.torch_trainer import TorchTrainer
from orchestrator.config import ActorConfig, AlgoConfig, ModelConfig, TaskConfig
from orchestrator.runtime.rank_failures import free_port, rendezvous_env
from tests.integration.lifecycle import start_ranks
from tests.integration.test_trainer_ranks import BASE, MODEL, make_batch

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"]}
ACTOR = {**BASE, "lr": 1e-3}  # B trains at 10x (actor.lora.lr_scale), as before it at 1e-2


def _trainer(lora=LORA, group=None, seed=3, adapter_only=False, **actor) -> TorchTrainer:
    cfg = ActorConfig(**{**ACTOR, **actor, "lora": lora})
    return TorchTrainer(ModelConfig(**MODEL), cfg, TaskConfig(name="copy2"), seed=seed, group=group,
                        algo=AlgoConfig(), adapter_only=adapter_only)


def _step(tr, i):
    batch = make_batch(seed=i)
    batch.ident = i + 1
    return tr.train_step(batch)


def _published(tr) -> bytes:
    buf = bytearray(tr.weight_nbytes())
    tr.write_weights(memoryview(buf))
    return bytes(buf)


def _files(directory) -> dict[str, int]:
    out = {}
    for d, _, names in os.walk(directory):
        for n in names:
            out[os.path.relpath(os.path.join(d, n), directory)] = os.path.getsize(os.path.join(d, n))
    return out


def test_only_the_adapters_train_and_version_0_is_the_base():
    tr = _trainer()
    full = _trainer(lora=None)
    assert _published(tr) == _published(full)       # B = 0: the merged weights are the base's
    assert tr.layout == full.layout                  # the layout inference loads, unchanged
    before = {n: p.detach().clone() for n, p in tr.module.named_parameters()}
    for i in range(3):
        assert _step(tr, i)["skipped"] == 0
    changed = {n for n, p in tr.module.named_parameters() if not torch.equal(p, before[n])}
    adapters = {n for n, p in tr.module.named_parameters() if p.requires_grad}
    assert changed == adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    assert len(adapters) == 2 * 4 * MODEL["num_layers"]
    state = tr.optimizer.state_dict()["state"]       # Adam's moments for the adapters only
    assert len(state) == len(adapters)
    assert sum(s["exp_avg"].numel() for s in state.values()) == sum(
        p.numel() for p in tr.module.parameters() if p.requires_grad)
    assert _published(tr) != _published(full)


def test_merged_publish_equals_peft_merge_and_unload():
    tr = _trainer(lora={**LORA, "dropout": 0.1})
    for i in range(3):
        _step(tr, i)
    merged = copy.deepcopy(tr.peft).merge_and_unload()
    inference = build_model(ModelConfig(**MODEL), len(tr.tokens.tokenizer), 3)  # what a worker holds
    load_flat(inference, memoryview(bytearray(_published(tr))), tr.layout)
    names = [n for n, _ in inference.named_parameters()]
    assert names == [n for n, _ in merged.named_parameters()]
    for (name, a), (_, b) in zip(merged.named_parameters(), inference.named_parameters()):
        assert torch.equal(a, b), name
    # and the trainer's own forward (base + adapters, no dropout in eval) is the merged model's
    batch = make_batch(seed=7)
    lp = tr.compute_logprobs(batch)
    tr.peft.base_model.model, keep = merged, tr.module       # the same forward on merged weights
    tr.model = merged
    try:
        lp_merged = tr.compute_logprobs(batch)
    finally:
        tr.model = keep
    assert np.abs(lp - lp_merged).max() < 1e-5


def test_checkpoint_holds_the_adapters_and_resumes_bit_for_bit(tmp_path):
    tr = _trainer()
    for i in range(2):
        _step(tr, i)
    tr.save(str(tmp_path / "lora"))
    files = _files(tmp_path / "lora")
    assert set(files) == {"optimizer.pt", "adapter/adapter_config.json",
                          "adapter/adapter_model.safetensors"}
    full = _trainer(lora=None)
    _step(full, 0)
    full.save(str(tmp_path / "full"))
    assert sum(files.values()) < 0.35 * sum(_files(tmp_path / "full").values())
    state = torch.load(tmp_path / "lora" / "optimizer.pt", weights_only=True)
    assert state["lora"]["hash"] == tr.base["hash"] and state["lora"]["rank"] == 4

    again = _trainer()
    again.load(str(tmp_path / "lora"))
    want, got = _step(tr, 2), _step(again, 2)
    assert (got["loss"], got["grad_norm"]) == (want["loss"], want["grad_norm"])
    assert _published(again) == _published(tr)


def test_resume_refuses_another_base_rank_or_kind(tmp_path):
    tr = _trainer()
    _step(tr, 0)
    tr.save(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match=r"another base model.*built-in model of run.seed.*hash "
                                         r"[0-9a-f]{16}.*hash [0-9a-f]{16}"):
        _trainer(seed=4).load(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match="actor.lora.rank=4, this run has 8"):
        _trainer(lora={**LORA, "rank": 8}).load(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match="holds LoRA adapters"):
        _trainer(lora=None).load(str(tmp_path / "lora"))
    full = _trainer(lora=None)
    full.save(str(tmp_path / "full"))
    with pytest.raises(ValueError, match="holds a full fine-tune"):
        _trainer().load(str(tmp_path / "full"))


def test_b_trains_at_lr_scale_and_a_slower_by_the_loraplus_ratio(tmp_path):
    """#39: two Adam groups, A at actor.lr x lr_scale / loraplus_lr_ratio and B at actor.lr x
    lr_scale (the step line's lr); Adam's first step moves each parameter by about its rate.
    A LoRA checkpoint holding one group (written before the groups) is refused naming it."""
    tr = _trainer(lora={**LORA, "lr_scale": 4.0, "loraplus_lr_ratio": 8.0})
    b0 = {n: p.detach().clone() for n, p in tr.module.named_parameters() if ".lora_B." in n}
    _step(tr, 0)                                     # B = 0: A's first gradient is 0
    stats = _step(tr, 1)
    assert stats["lr"] == pytest.approx(ACTOR["lr"] * 4.0)
    lrs = [g["lr"] for g in tr.optimizer.param_groups]
    assert lrs == pytest.approx([ACTOR["lr"] * 4.0 / 8.0, ACTOR["lr"] * 4.0])
    named = dict(tr.module.named_parameters())
    assert {id(p) for p in tr.optimizer.param_groups[0]["params"]} == {
        id(p) for n, p in named.items() if ".lora_A." in n}
    step_b = max(float((named[n] - b0[n]).abs().max()) for n in b0)
    assert ACTOR["lr"] * 4.0 <= step_b <= 2 * ACTOR["lr"] * 4.0 * 1.01   # two steps of ~lr each
    tr.save(str(tmp_path / "ck"))
    path = tmp_path / "ck" / "optimizer.pt"
    state = torch.load(path, weights_only=True)
    groups = state["optimizer"]["param_groups"]
    state["optimizer"]["param_groups"] = [{**groups[1], "params": groups[0]["params"] + groups[1]["params"]}]
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"holds 1 optimizer parameter group\(s\), this run's "
                                         r"LoRA trains 2"):
        _trainer(lora={**LORA, "lr_scale": 4.0, "loraplus_lr_ratio": 8.0}).load(str(tmp_path / "ck"))


# ------------------------------------------------------------------------------- trainer ranks

def _rank(rank, world, port, actor, ckpt, weights_path, out, phase):
    """phase 'run': steps on batches 0 and 1, saving after step 1; 'load': load, step on batch 1.
    Rank 0 saves the stats and the last step's gradients; every rank writes its merged shards."""
    from orchestrator.backends.sharding import RankGroup
    faulthandler.enable(all_threads=True)
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(1)
    actor = {**actor, "num_ranks": world}
    tr = _trainer(group=RankGroup.from_env(ActorConfig(**ACTOR, **actor), torch.device("cpu")), **actor)
    stats = []
    if phase == "load":
        tr.load(ckpt)
    else:
        stats.append(_step(tr, 0))
        tr.save(ckpt)
    stats.append(_step(tr, 1))
    grads = {k: v for k, v in tr.gradients().items() if v is not None}
    with open(weights_path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        tr.write_weights(memoryview(mm))
        del mm
    if rank == 0:
        torch.save({"stats": stats, "grads": grads}, out)
    tr.group.barrier()
    tr.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)     # as trainer workers do: gloo's native threads may abort at finalization


def test_two_fsdp_ranks_same_lora_loss_gradients_weights_and_resume(tmp_path):
    one = _trainer()
    want = [_step(one, 0), _step(one, 1)]
    want_grads = {k: v for k, v in one.gradients().items() if v is not None}
    want_weights = np.frombuffer(_published(one), np.float32)
    ckpt, out = str(tmp_path / "ckpt"), tmp_path / "rank0.pt"
    actor = {"sharding": "fsdp", "micro_batch_tokens": 30, "pack_sequences": True}
    got = {}
    for phase in ("run", "load"):
        path = tmp_path / f"w-{phase}"
        path.write_bytes(b"\xff" * one.weight_nbytes())        # bytes no rank wrote stay 0xff
        start_ranks(_rank, (2, free_port(), actor, ckpt, str(path), str(out), phase), 2)
        got[phase] = torch.load(out, weights_only=False), path.read_bytes()
    (run, run_weights), (resumed, resumed_weights) = got["run"], got["load"]
    for s0, s1 in zip(want, run["stats"]):
        for k in ("loss", "entropy", "clip_frac", "grad_norm", "logprob_diff_mean", "tokens"):
            assert s1[k] == pytest.approx(s0[k], rel=1e-4, abs=1e-6), k
    assert set(run["grads"]) == set(want_grads)
    assert any(float(g.abs().max()) > 0 for k, g in want_grads.items() if ".lora_A." in k)
    for k, g in want_grads.items():
        assert torch.allclose(run["grads"][k], g, rtol=1e-4, atol=1e-6), k
    assert np.allclose(np.frombuffer(run_weights, np.float32), want_weights, rtol=1e-4, atol=1e-6)
    assert resumed_weights == run_weights             # the sharded adapters and Adam state came back
    assert resumed["stats"][0]["loss"] == run["stats"][1]["loss"]
    files = _files(ckpt)
    assert "adapter/adapter_model.safetensors" in files and not any(f.startswith("hf/") for f in files)


# ------------------------------------------------------------------- adapter-only publish (#25 item 2)

def test_adapter_only_publish_is_the_adapters_in_their_own_layout():
    """inference.vllm.lora: the trainer publishes A and B of each target layer alone, in the layout
    the run's weight buffer is sized with (resources.weight_nbytes), a fraction of the merged size."""
    from orchestrator.backends import lora
    from orchestrator.config import Config, InferenceConfig, LoraConfig, VllmConfig
    from orchestrator.runtime.resources import weight_nbytes

    tr = _trainer(adapter_only=True)
    cfg = Config(model=ModelConfig(**MODEL), task=TaskConfig(name="copy2"),
                 inference=InferenceConfig(backend="vllm", vllm=VllmConfig(lora=True)),
                 actor=ActorConfig(**{**ACTOR, "lora": LoraConfig(**LORA)}))
    assert weight_nbytes(cfg) == tr.weight_nbytes() < _trainer().weight_nbytes() / 4
    _step(tr, 0)
    published = lora.adapter_from_flat(tr.layout, bytearray(_published(tr)))
    want = lora.adapter_tensors(tr.peft)
    assert list(published) == list(want) and len(want) == 2 * 2 * len(LORA["target_modules"])
    for name, t in want.items():
        assert torch.equal(published[name], t), name
    assert any(float(t.abs().max()) > 0 for n, t in want.items() if ".lora_B." in n)
    with pytest.raises(ValueError, match="adapter-only publishing .* needs actor.lora"):
        _trainer(lora=None, adapter_only=True)


def _adapter_rank(rank, world, port, actor, weights_path):
    """One step on batch 0, then every rank joins the adapter-only publish (rank 0 writes)."""
    from orchestrator.backends.sharding import RankGroup
    faulthandler.enable(all_threads=True)
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(1)
    actor = {**actor, "num_ranks": world}
    tr = _trainer(group=RankGroup.from_env(ActorConfig(**ACTOR, **actor), torch.device("cpu")),
                  adapter_only=True, **actor)
    _step(tr, 0)
    with open(weights_path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        tr.write_weights(memoryview(mm))
        del mm
    tr.group.barrier()
    tr.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_two_fsdp_ranks_publish_the_same_adapters_as_one(tmp_path):
    """FSDP2 shards A and B; the adapter-only publish gathers them and rank 0 writes them all."""
    one = _trainer(adapter_only=True)
    _step(one, 0)
    want = _published(one)
    path = tmp_path / "adapters"
    path.write_bytes(b"\xff" * len(want))
    start_ranks(_adapter_rank, (2, free_port(), {"sharding": "fsdp"}, str(path)), 2)
    assert np.allclose(np.frombuffer(path.read_bytes(), np.float32), np.frombuffer(want, np.float32),
                       rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------- export

def _committed(tmp_path, tr, seed=3) -> str:
    """A run directory holding one committed checkpoint (step 2) of trainer `tr`, whose resolved
    config names the built-in model of run.seed `seed`."""
    from orchestrator.run import checkpoint
    run_dir = str(tmp_path / f"run-{seed}-{tr.peft is not None}")
    tmp = checkpoint.begin(run_dir, 2)
    tr.save(os.path.join(tmp, "trainer"))
    checkpoint.write_state(tmp, {"step": 2, "cursor": 0, "redo": [], "gate": {},
                                 "config": {"model": MODEL, "run": {"seed": seed}}}, [])
    checkpoint.commit(tmp)
    return run_dir


def test_export_writes_the_merged_model_and_the_peft_adapter(tmp_path, capfd):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from orchestrator.export import merge_lora
    from orchestrator.run.export import main

    tr = _trainer()
    for i in range(2):
        _step(tr, i)
    run_dir = _committed(tmp_path, tr)
    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    assert main([run_dir, str(merged_dir)], merge_lora=merge_lora) == 0
    assert main([run_dir, str(adapter_dir), "--adapter"]) == 0        # a copy: no torch needed
    ids = torch.tensor([[1, 5, 9, 3, 11, 7, 12, 2]])
    base = build_model(ModelConfig(**MODEL), len(tr.tokens.tokenizer), 3)
    with torch.no_grad():
        want = tr.model(input_ids=ids).logits
        assert (want - base(input_ids=ids).logits).abs().max() > 1e-4     # the adapters trained
        merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
        adapted = PeftModel.from_pretrained(base, adapter_dir).eval()
        for got in (merged(input_ids=ids).logits, adapted(input_ids=ids).logits):
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    capfd.readouterr()

    # another base than the checkpoint's (run.seed 4 builds other weights): exit 2, nothing written
    other = _committed(tmp_path, tr, seed=4)
    assert main([other, str(tmp_path / "m2")], merge_lora=merge_lora) == 2
    err = capfd.readouterr().err.strip()
    assert "another base" in err and err.count("weights hash") == 2 and "\n" not in err
    assert not (tmp_path / "m2").exists()
    # --adapter of a run that trained every weight: exit 2 naming the flag
    full = _committed(tmp_path, _trainer(lora=None))
    assert main([full, str(tmp_path / "a2"), "--adapter"]) == 2
    assert "without --adapter" in capfd.readouterr().err
    assert main([full, str(tmp_path / "full")]) == 0 and (tmp_path / "full" / "config.json").exists()
