"""Trainer ranks compute what one rank computes: the same loss and gradients for one batch whatever
the split (1 rank or 2 gloo ranks, FSDP2 or DDP, any micro-batch budget), and the ranks' shard writes
assemble exactly the flat weights one rank writes. Real processes, a real gloo process group."""
import faulthandler
import mmap
import os
import sys

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from orchestrator.backends.torch_trainer import TorchTrainer
from orchestrator.config import ActorConfig, AlgoConfig, ModelConfig, TaskConfig
from orchestrator.backends.model import load_flat
from orchestrator.runtime.rank_failures import free_port, rendezvous_env
from shm.codec import Sequences

MODEL = dict(hidden_size=32, num_layers=2, num_heads=4, max_seq_len=64)
BASE = dict(backend="torch", lr=1e-3, ppo_epochs=1, entropy_coef=0.01)


def make_batch(seed=0, n=7) -> Sequences:
    """Sequences of different lengths with prompt (unmasked) and answer (masked) tokens, behaviour
    logprobs near the model's, advantages of both signs, versions 0 and 1 (the batch is at 1)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(4, 20, size=n)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    total = int(offsets[-1])
    tokens = rng.integers(3, 19, size=total).astype(np.int32)
    mask = np.zeros(total, dtype=np.uint8)
    prompt = np.minimum(3, lens - 1)
    for i in range(n):
        mask[offsets[i] + prompt[i]:offsets[i + 1]] = 1
    return Sequences(kind=1, ident=1, version=1, offsets=offsets,
                     prompt_lens=prompt.astype(np.int32), prompt_ids=np.arange(n, dtype=np.int64),
                     tokens=tokens, logprobs=(-3.0 + 0.1 * rng.standard_normal(total)).astype(np.float32),
                     versions=rng.integers(0, 2, size=total).astype(np.int32), loss_mask=mask,
                     rewards=rng.random(n).astype(np.float32),
                     advantages=rng.standard_normal(n).astype(np.float32),
                     scalars=np.zeros(0, dtype=np.float64))


def _trainer(actor: dict, group=None, device="cpu", algo=None) -> TorchTrainer:
    return TorchTrainer(ModelConfig(**MODEL), ActorConfig(**BASE, **actor), TaskConfig(name="copy2"),
                        seed=3, group=group, device=device, algo=AlgoConfig(**(algo or {})))


def _rank(rank, world, port, actor, weights_path, out, device="cpu", algo=None):
    from orchestrator.backends.sharding import RankGroup
    faulthandler.enable(all_threads=True)     # a native abort shows every thread's Python stack
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(1)
    cfg = ActorConfig(**BASE, **actor, num_ranks=world)
    dev = torch.device(f"cuda:{rank}" if device == "cuda" else "cpu")
    tr = _trainer(dict(actor, num_ranks=world), RankGroup.from_env(cfg, dev), dev, algo)
    stats = tr.train_step(make_batch())
    grads = tr.gradients()
    with open(weights_path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        tr.write_weights(memoryview(mm))     # every rank writes its own shards, in place
        del mm
    if rank == 0:
        torch.save({"stats": stats, "grads": grads}, out)
    tr.group.barrier()            # as the trainer worker does at shutdown: close together
    tr.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)     # as trainer workers do: gloo's native threads may abort at finalization


def run_ranks(tmp_path, world, actor, device="cpu", algo=None):
    one = _trainer({})
    path = tmp_path / "weights"
    path.write_bytes(b"\xff" * one.weight_nbytes())          # bytes no rank wrote stay 0xff
    out = tmp_path / "rank0.pt"
    mp.start_processes(_rank, args=(world, free_port(), actor, str(path), str(out), device, algo),
                       nprocs=world, start_method="spawn", join=True)
    got = torch.load(out, weights_only=False)
    return got["stats"], got["grads"], path.read_bytes()


def single(actor, device="cpu", algo=None):
    tr = _trainer(actor, device=device, algo=algo)
    stats = tr.train_step(make_batch())
    buf = bytearray(tr.weight_nbytes())
    tr.write_weights(memoryview(buf))
    return stats, tr.gradients(), bytes(buf)


def assert_same(ref, got, what, tol=1e-4):
    (s0, g0, w0), (s1, g1, w1) = ref, got
    for k in ("loss", "entropy", "clip_frac", "approx_kl", "grad_norm", "logprob_diff_mean",
              "logprob_diff_max", "logprob_diff_tokens", "tokens"):
        assert s1[k] == pytest.approx(s0[k], rel=tol, abs=tol / 100), f"{what}: {k}"
    assert set(g0) == set(g1)
    for name in g0:
        assert torch.allclose(g1[name], g0[name], rtol=tol, atol=tol / 100), f"{what}: grad of {name}"
    a, b = np.frombuffer(w0, np.float32), np.frombuffer(w1, np.float32)
    assert np.allclose(a, b, rtol=tol, atol=tol / 100), f"{what}: published weights differ"


@pytest.fixture(scope="module")
def reference():
    return single({})


@pytest.mark.parametrize("budget,packed,ckpt", [(None, False, False), (40, False, False),
                                                (1, False, False), (None, True, False),
                                                (30, True, False), (40, False, True)])
def test_micro_batches_change_nothing(reference, budget, packed, ckpt):
    got = single({"micro_batch_tokens": budget, "pack_sequences": packed,
                  "activation_checkpointing": ckpt})
    assert_same(reference, got, f"1 rank, budget {budget}, packed {packed}, checkpointing {ckpt}")


@pytest.mark.parametrize("sharding,budget,packed", [("fsdp", None, False), ("fsdp", 30, False),
                                                    ("ddp", 30, False), ("fsdp", 30, True)])
def test_two_ranks_same_loss_gradients_and_weights(tmp_path, reference, sharding, budget, packed):
    got = run_ranks(tmp_path, 2, {"sharding": sharding, "micro_batch_tokens": budget,
                                  "pack_sequences": packed})
    assert_same(reference, got, f"2 ranks {sharding}, budget {budget}, packed {packed}")
    assert got[0]["tokens"] > 0 and got[0]["skipped"] == 0


def test_one_fsdp_rank(tmp_path, reference):
    """actor.sharding=fsdp at world size 1: the sharded code path on a group of one."""
    assert_same(reference, run_ranks(tmp_path, 1, {"sharding": "fsdp", "micro_batch_tokens": 30}),
                "1 rank fsdp")


def test_more_ranks_than_sequences(tmp_path, reference):
    """3 ranks, fsdp, a budget that makes 1-sequence micro-batches: some ranks run zero-weight
    passes so that every rank joins the same collectives."""
    got = run_ranks(tmp_path, 3, {"sharding": "fsdp", "micro_batch_tokens": 16})
    assert_same(reference, got, "3 ranks fsdp")


# The recipes (issue #24): the sequence-level aggregations need the global sequence count, as
# token-mean needs the global token count; each combination also runs a sequence-level loss or
# correction on packed rows, which the trainer lays out one sequence per row.
RECIPES = {
    "gspo, seq-mean-token-mean, tis sequence": (
        {"use_decoupled_loss": False, "eps_clip": 3e-4, "eps_clip_higher": 4e-4},
        {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean", "rollout_correction": "tis",
         "correction_level": "sequence", "correction_threshold": 1.5}),
    "cispo, seq-mean-token-sum, mis geometric": (
        {"use_decoupled_loss": False, "eps_clip_higher": 0.28},
        {"policy_loss": "cispo", "loss_agg_mode": "seq-mean-token-sum", "rollout_correction": "mis",
         "correction_level": "geometric", "correction_threshold": 1.2, "correction_threshold_low": 0.8}),
    "ppo dual clip, seq-mean-token-sum-norm, decoupled": (
        {"c_clip": 3.0}, {"loss_agg_mode": "seq-mean-token-sum-norm", "loss_horizon": 16}),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if i else [])
                                  for i, n in enumerate(RECIPES)])   # ~25 s each: one by default
def test_recipes_are_split_invariant(tmp_path, name):
    actor, algo = RECIPES[name]
    ref = single(actor, algo=algo)
    assert ref[0]["skipped"] == 0 and ref[0]["imp_weight_mean"] != 1.0
    for budget, packed in [(1, False), (30, True)]:
        got = single(dict(actor, micro_batch_tokens=budget, pack_sequences=packed), algo=algo)
        assert_same(ref, got, f"{name}: 1 rank, budget {budget}, packed {packed}")
    got = run_ranks(tmp_path, 2, dict(actor, sharding="fsdp", micro_batch_tokens=30,
                                      pack_sequences=True), algo=algo)
    assert_same(ref, got, f"{name}: 2 ranks fsdp, packed")


def _rank_resume(rank, world, port, ckpt, weights_path, phase):
    """phase 'save': step on batch 0, save, step on batch 1; 'background': step on batch 0, take
    a snapshot, step on batch 1, then write the snapshot in a thread while the main thread runs its
    own collectives (the trainer worker's background save); 'load': load, step on batch 1.
    Each writes the weights after its last step (each rank its shards)."""
    import threading
    from orchestrator.backends.sharding import RankGroup
    faulthandler.enable(all_threads=True)     # a native abort shows every thread's Python stack
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(1)
    actor = {"num_ranks": world, "micro_batch_tokens": 40}
    tr = _trainer(actor, RankGroup.from_env(ActorConfig(**BASE, **actor), torch.device("cpu")))
    if phase == "load":
        tr.load(ckpt)
    else:
        tr.train_step(make_batch(0))
        write = tr.snapshot() if phase == "background" else tr.save(ckpt)
        with open(weights_path + "-at-save", "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
            tr.write_weights(memoryview(mm))
            del mm
        tr.group.barrier()
    tr.train_step(make_batch(1))
    writer = None
    if phase == "background":     # after step 1: a snapshot sharing the live state saves step 1's
        writer = threading.Thread(target=write, args=(ckpt,))
        writer.start()
    with open(weights_path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        tr.write_weights(memoryview(mm))
        del mm
    for _ in range(20):           # the training group's collectives while the writer runs its own
        tr.group.reduce([1.0])
        tr.group.barrier()
    if writer is not None:
        writer.join()
    tr.group.barrier()
    tr.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.parametrize("save", ["save", "background"])
def test_sharded_checkpoint_resumes_weights_and_optimizer(tmp_path, save):
    """A DCP checkpoint of 2 FSDP2 ranks, loaded by 2 fresh ranks: the next step gives the same
    weights bit for bit as the run that never stopped (Adam's moments came back too); its hf/
    export holds the full weights that transformers loads. Saved at once, or (background) from a
    snapshot written by a thread after the next step changed the live state."""
    from transformers import AutoModelForCausalLM
    n = _trainer({}).weight_nbytes()
    ckpt = str(tmp_path / "ckpt")
    out = {}
    (tmp_path / f"w-{save}-at-save").write_bytes(b"\xff" * n)
    for phase in (save, "load"):
        path = tmp_path / f"w-{phase}"
        path.write_bytes(b"\xff" * n)
        mp.start_processes(_rank_resume, args=(2, free_port(), ckpt, str(path), phase), nprocs=2,
                           start_method="spawn", join=True)
        out[phase] = path.read_bytes()
    assert out[save] == out["load"]
    assert sorted(os.listdir(os.path.join(ckpt, "dcp")))[:1] == [".metadata"]
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(ckpt, "hf"))
    saved = bytearray((tmp_path / f"w-{save}-at-save").read_bytes())
    one = _trainer({})
    load_flat(one.module, memoryview(saved), one.layout)
    for (name, a), (_, b) in zip(one.module.named_parameters(), hf.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2])
def test_fsdp2_nccl_matches_one_gpu(tmp_path, world):
    """FSDP2 over NCCL (world 1, and 2 where there are two GPUs) computes what one unsharded GPU
    computes: loss, gradients, published weights (TF32 and kernel choice: a looser tolerance)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA device(s)")
    ref = single({}, device="cuda")
    got = run_ranks(tmp_path, world, {"sharding": "fsdp", "micro_batch_tokens": 30}, device="cuda")
    assert_same(ref, got, f"{world} GPU rank(s), fsdp", tol=2e-3)


def test_bf16_compute_with_fp32_reduction(tmp_path, reference):
    """actor.param_dtype=bfloat16 with reduce_dtype=float32 (FSDP2's MixedPrecisionPolicy) on 2
    gloo ranks: the parameters stay fp32 (so do the published weights), the step matches the fp32
    one to bf16 precision."""
    got = run_ranks(tmp_path, 2, {"sharding": "fsdp", "param_dtype": "bfloat16",
                                  "reduce_dtype": "float32"})
    (s0, g0, w0), (s1, g1, w1) = reference, got
    assert s1["loss"] == pytest.approx(s0["loss"], rel=0.05, abs=1e-3)
    for name in g0:
        cos = torch.nn.functional.cosine_similarity(g0[name].flatten(), g1[name].flatten(), dim=0)
        assert cos > 0.98, (name, float(cos))
    assert not np.array_equal(np.frombuffer(w0, np.float32), np.frombuffer(w1, np.float32))
    assert np.allclose(np.frombuffer(w0, np.float32), np.frombuffer(w1, np.float32), atol=1e-2)
