"""vLLM engine defaults that serve a real model (issue #10 item 3): the context follows the task,
the CPU KV cache holds inference.max_batch sequences of it (the old fixed 256 MiB could not start a
0.5B model at a 512-token context), the GPU one is left to gpu_memory_utilization."""
from types import SimpleNamespace

import pytest

from orchestrator.config import Config

pytest.importorskip("torch")
from orchestrator.backends.vllm_inference import context_length, engine_dtype, kv_cache_bytes  # noqa: E402

# Qwen2.5-0.5B's attention shape
QWEN05 = SimpleNamespace(max_position_embeddings=32768, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, hidden_size=896)


def _cfg(**vllm):
    return Config.model_validate({
        "inference": {"backend": "vllm", "max_batch": 64, "vllm": vllm},
        "actor": {"backend": "torch"}, "model": {"dtype": "bfloat16"},
        "rollout": {"max_new_tokens": 256}, "task": {"name": "copy2"}})


def test_context_is_the_task_capped_by_the_model():
    assert context_length(_cfg(), QWEN05, prompt_tokens=256) == 512
    assert context_length(_cfg(), QWEN05, prompt_tokens=0) == 32768          # unknown: the model's
    small = SimpleNamespace(**{**vars(QWEN05), "max_position_embeddings": 300})
    assert context_length(_cfg(), small, prompt_tokens=256) == 300
    assert context_length(_cfg(max_model_len=1024), QWEN05, prompt_tokens=256) == 1024


def test_multiturn_context_is_the_episode_budget():
    cfg = Config.model_validate({"inference": {"backend": "vllm"}, "actor": {"backend": "torch"},
                                 "rollout": {"max_new_tokens": 8},
                                 "task": {"name": "lookup", "max_episode_tokens": 40}})
    assert context_length(cfg, QWEN05, prompt_tokens=4) == 40         # not 4 + 8: turns and replies
    cfg.task.max_episode_tokens = None                                # the built-in model's context
    assert context_length(cfg, QWEN05, prompt_tokens=4) == cfg.model.max_seq_len


def test_cpu_kv_cache_fits_max_batch_sequences_of_the_context():
    per_token = 2 * 24 * 2 * 64 * 2                       # K and V, layers, kv heads, head_dim, bf16
    need = 64 * 512 * per_token
    got = kv_cache_bytes(_cfg(), QWEN05, 512)
    assert got >= need > 256 << 20                        # the old default could not hold it
    assert kv_cache_bytes(_cfg(kv_cache_memory_mb=100), QWEN05, 512) == 100 << 20
    tiny = SimpleNamespace(max_position_embeddings=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, hidden_size=64)
    assert kv_cache_bytes(_cfg(), tiny, 64) == 64 << 20   # a floor for tiny models


def test_gpu_kv_cache_is_left_to_gpu_memory_utilization():
    cfg = _cfg()
    cfg.inference.devices = ["0"]
    assert kv_cache_bytes(cfg, QWEN05, 512) is None


def test_engine_dtype_is_bf16_on_gpu_for_a_float32_model():
    """auto: the trainer's dtype on CPU (logprobs match exactly); bf16 on GPU for a float32 model."""
    cfg = _cfg()
    for model, cpu, gpu in (("float32", "float32", "bfloat16"), ("bfloat16", "bfloat16", "bfloat16"),
                            ("float16", "float16", "float16")):
        cfg.model.dtype, cfg.inference.devices = model, []
        assert engine_dtype(cfg) == cpu
        cfg.inference.devices = ["0"]
        assert engine_dtype(cfg) == gpu
    cfg.model.dtype, cfg.inference.vllm.dtype = "float32", "float32"   # as set, anywhere
    assert engine_dtype(cfg) == "float32"
    cfg.inference.devices = []
    cfg.model.dtype, cfg.inference.vllm.dtype = "float32", "bfloat16"
    per_token = 2 * 24 * 2 * 64 * 2                        # the CPU cache in the engine's dtype
    assert kv_cache_bytes(cfg, QWEN05, 512) == 64 * 512 * per_token * 5 // 4
