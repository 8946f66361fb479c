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

from orchestrator.backends.torch_trainer import TorchTrainer
from orchestrator.config import ActorConfig, AlgoConfig, ModelConfig, TaskConfig
from orchestrator.backends.model import load_flat
from orchestrator.runtime.rank_failures import free_port, rendezvous_env
from tests.integration.lifecycle import start_ranks
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


def _rank(rank, world, port, cases, out_dir, device="cpu"):
    """One rank of a `world`-rank group that trains one fresh trainer per case, in order, on one
    process group (a spawn and a rendezvous are the expensive part, a tiny step is not): each
    case's trainer takes one step on the same batch and writes its shards into `out_dir/<i>.w`;
    rank 0 saves each case's stats and full gradients to `out_dir/<i>.pt`."""
    from dataclasses import replace
    from orchestrator.backends.sharding import RankGroup
    faulthandler.enable(all_threads=True)     # a native abort shows every thread's Python stack
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(1)
    dev = torch.device(f"cuda:{rank}" if device == "cuda" else "cpu")
    group = None
    for i, (actor, algo) in enumerate(cases):
        cfg = ActorConfig(**BASE, **actor, num_ranks=world)
        group = (RankGroup.from_env(cfg, dev) if group is None
                 else replace(group, strategy=cfg.strategy))    # the same process group
        tr = _trainer(dict(actor, num_ranks=world), group, dev, algo)
        stats = tr.train_step(make_batch())
        grads = tr.gradients()
        with open(os.path.join(out_dir, f"{i}.w"), "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
            tr.write_weights(memoryview(mm))     # every rank writes its own shards, in place
            del mm
        if rank == 0:
            torch.save({"stats": stats, "grads": grads}, os.path.join(out_dir, f"{i}.pt"))
        group.barrier()
    group.barrier()               # as the trainer worker does at shutdown: close together
    tr.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)     # as trainer workers do: gloo's native threads may abort at finalization


def run_ranks_cases(out_dir, world, cases, device="cpu"):
    """[(stats, grads, weight bytes)] of each (actor, algo) case trained on one `world`-rank group."""
    n = _trainer({}).weight_nbytes()
    os.makedirs(out_dir, exist_ok=True)
    for i in range(len(cases)):
        with open(os.path.join(out_dir, f"{i}.w"), "wb") as f:
            f.write(b"\xff" * n)                             # bytes no rank wrote stay 0xff
    start_ranks(_rank, (world, free_port(), cases, str(out_dir), device), world)
    out = []
    for i in range(len(cases)):
        got = torch.load(os.path.join(out_dir, f"{i}.pt"), weights_only=False)
        with open(os.path.join(out_dir, f"{i}.w"), "rb") as f:
            out.append((got["stats"], got["grads"], f.read()))
    return out


def run_ranks(tmp_path, world, actor, device="cpu", algo=None):
    return run_ranks_cases(tmp_path / "ranks", world, [(actor, algo)], device)[0]


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


TWO_RANKS = [("fsdp", None, False), ("fsdp", 30, False), ("ddp", 30, False), ("fsdp", 30, True)]
BF16 = {"sharding": "fsdp", "param_dtype": "bfloat16", "reduce_dtype": "float32"}


def _recipe_on_ranks(name):
    actor, algo = RECIPES[name]
    return dict(actor, sharding="fsdp", micro_batch_tokens=30, pack_sequences=True), algo


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every 2-rank case of this file trained on ONE 2-rank gloo group (one spawn, one rendezvous):
    {case name: (stats, grads, weight bytes)}."""
    cases = {**{("split",) + c: ({"sharding": c[0], "micro_batch_tokens": c[1], "pack_sequences": c[2]},
                                 None) for c in TWO_RANKS},
             "bf16": (BF16, None), **{name: _recipe_on_ranks(name) for name in RECIPES}}
    got = run_ranks_cases(tmp_path_factory.mktemp("two_ranks"), 2, list(cases.values()))
    return dict(zip(cases, got))


@pytest.mark.parametrize("sharding,budget,packed", TWO_RANKS)
def test_two_ranks_same_loss_gradients_and_weights(two_ranks, reference, sharding, budget, packed):
    got = two_ranks[("split", sharding, budget, packed)]
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


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipes_are_split_invariant(two_ranks, name):
    actor, algo = RECIPES[name]
    ref = single(actor, algo=algo)
    assert ref[0]["skipped"] == 0 and ref[0]["imp_weight_mean"] != 1.0
    for budget, packed in [(1, False), (30, True)]:
        got = single(dict(actor, micro_batch_tokens=budget, pack_sequences=packed), algo=algo)
        assert_same(ref, got, f"{name}: 1 rank, budget {budget}, packed {packed}")
    assert_same(ref, two_ranks[name], f"{name}: 2 ranks fsdp, packed")


def _rank_resume(rank, world, port, tmp, phases):
    """Per phase, on one 2-rank group, a fresh trainer: 'save': step on batch 0, save, step on
    batch 1; 'background': step on batch 0, take a snapshot, step on batch 1, then write the
    snapshot in a thread while the main thread runs its own collectives (the trainer worker's
    background save); 'load-save' / 'load-background': load that checkpoint, step on batch 1.
    Each writes the weights after its last step (each rank its shards) to `tmp/w-<phase>`."""
    import threading
    from orchestrator.backends.sharding import RankGroup
    faulthandler.enable(all_threads=True)     # a native abort shows every thread's Python stack
    os.environ.update(rendezvous_env(rank, world, port))
    torch.set_num_threads(1)
    actor = {"num_ranks": world, "micro_batch_tokens": 40}
    group = RankGroup.from_env(ActorConfig(**BASE, **actor), torch.device("cpu"))
    for phase in phases:
        ckpt, weights_path = os.path.join(tmp, "ckpt-" + phase.split("-")[-1]), os.path.join(tmp, "w-" + phase)
        tr = _trainer(actor, group)
        if phase.startswith("load"):
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


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Both ways of saving on 2 FSDP2 ranks (one group), then both checkpoints loaded by 2 fresh
    ranks (a second group): the folder holding their weight files and checkpoints."""
    tmp = tmp_path_factory.mktemp("resumed")
    n = _trainer({}).weight_nbytes()
    for name in ("save", "background", "load-save", "load-background"):
        (tmp / f"w-{name}").write_bytes(b"\xff" * n)
    for name in ("save", "background"):
        (tmp / f"w-{name}-at-save").write_bytes(b"\xff" * n)
    for phases in (["save", "background"], ["load-save", "load-background"]):
        start_ranks(_rank_resume, (2, free_port(), str(tmp), phases), 2)
    return tmp


@pytest.mark.parametrize("save", ["save", "background"])
def test_sharded_checkpoint_resumes_weights_and_optimizer(resumed, save):
    """A DCP checkpoint of 2 FSDP2 ranks, loaded by 2 fresh ranks: the next step gives the same
    weights bit for bit as the run that never stopped (Adam's moments came back too); its hf/
    export holds the full weights that transformers loads. Saved at once, or (background) from a
    snapshot written by a thread after the next step changed the live state."""
    from transformers import AutoModelForCausalLM
    ckpt = str(resumed / f"ckpt-{save}")
    weights = (resumed / f"w-{save}").read_bytes()
    assert b"\xff" * 8 not in weights                  # every shard written (0xff x 8: NaNs)
    assert weights == (resumed / f"w-load-{save}").read_bytes()
    assert sorted(os.listdir(os.path.join(ckpt, "dcp")))[:1] == [".metadata"]
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(ckpt, "hf"))
    saved = bytearray((resumed / f"w-{save}-at-save").read_bytes())
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


def test_bf16_compute_with_fp32_reduction(two_ranks, reference):
    """actor.param_dtype=bfloat16 with reduce_dtype=float32 (FSDP2's MixedPrecisionPolicy) on 2
    gloo ranks: the parameters stay fp32 (so do the published weights), the step matches the fp32
    one to bf16 precision."""
    got = two_ranks["bf16"]
    (s0, g0, w0), (s1, g1, w1) = reference, got
    assert s1["loss"] == pytest.approx(s0["loss"], rel=0.05, abs=1e-3)
    for name in g0:
        cos = torch.nn.functional.cosine_similarity(g0[name].flatten(), g1[name].flatten(), dim=0)
        assert cos > 0.98, (name, float(cos))
    assert not np.array_equal(np.frombuffer(w0, np.float32), np.frombuffer(w1, np.float32))
    assert np.allclose(np.frombuffer(w0, np.float32), np.frombuffer(w1, np.float32), atol=1e-2)
