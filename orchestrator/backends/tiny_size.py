"""The built-in tiny model's flat weight size from its config alone, without importing torch.

Contract: `tiny_weight_nbytes(model_cfg, vocab_size) -> int` equals
`flat_layout(build_model(model_cfg, vocab_size, seed)).nbytes` for a config without `model.path`
(tests/unit/test_flat_weights.py holds them equal over several shapes and dtypes). The supervisor
sizes the run's weight buffer with it before any worker starts: importing torch and transformers'
Llama there cost several seconds of every launch. The shapes are those of `model._tiny_config`:
a LlamaForCausalLM with intermediate size 2 x hidden, as many key/value heads as heads, no biases,
untied embeddings; one slot per parameter in `named_parameters` order, each 64-byte aligned.
"""
from __future__ import annotations

_ALIGN = 64
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def _slots(model_cfg, vocab_size: int) -> list[int]:
    h, inter = model_cfg.hidden_size, 2 * model_cfg.hidden_size
    layer = [h * h] * 4 + [inter * h] * 3 + [h, h]       # q k v o, gate up down, two norms
    return [vocab_size * h, *layer * model_cfg.num_layers, h, vocab_size * h]


def tiny_weight_nbytes(model_cfg, vocab_size: int) -> int:
    size = _ITEMSIZE[model_cfg.dtype]
    return sum((n * size + _ALIGN - 1) // _ALIGN * _ALIGN for n in _slots(model_cfg, vocab_size))
