"""Token budgets of a workload, known from its config before any data is loaded.

`max_prompt_tokens(cfg)`: the longest prompt (sim, a digit task, or `task.max_prompt_tokens`);
`max_completion_tokens(cfg)`: the longest completion; `model_context(cfg)`: the model's context
length (built-in model or model.path's config.json; `context_of(meta)` reads it from a
config.json's fields, for preflight too); `episode_tokens(cfg)`: tokens one multi-turn
episode may hold (None for a single-turn task). Ring sizes, the event loop and the backends read
these; they import nothing heavy (a JSON read at most).
"""
from __future__ import annotations

import json
import os
from typing import Optional


def max_prompt_tokens(cfg) -> int:
    """Longest prompt of the configured task, known without loading data: sim, a digit task, or
    `task.max_prompt_tokens` (ValueError naming the field otherwise: pass the loaded set's)."""
    if cfg.task.name == "sim":
        return cfg.inference.sim.prompt_tokens
    if cfg.task.own_data:
        if cfg.task.max_prompt_tokens is None:
            raise ValueError("task.dataset(s) without task.max_prompt_tokens: the longest prompt "
                             "is known once the dataset is loaded")
        return cfg.task.max_prompt_tokens
    from orchestrator.data.digits import max_prompt_tokens as digit_prompt_tokens
    return digit_prompt_tokens(cfg.task.name)


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len")


def context_of(meta: dict) -> Optional[tuple[int, str]]:
    """(context length, the key naming it) from an HF config.json's fields, or None."""
    for key in CONTEXT_KEYS:
        n = meta.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n, key
    return None


def model_context(cfg) -> int:
    """The model's context length: model.max_seq_len for the built-in model, else what
    model.path's config.json names (`context_of`; ValueError naming it when absent)."""
    if cfg.model.path is None:
        return cfg.model.max_seq_len
    path = os.path.join(cfg.model.path, "config.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.path={cfg.model.path}: cannot read config.json ({exc})") from None
    found = context_of(meta) if isinstance(meta, dict) else None
    if found is None:
        raise ValueError(f"model.path={cfg.model.path}: config.json names no context length "
                         f"(max_position_embeddings); set task.max_episode_tokens")
    return found[0]


def episode_tokens(cfg) -> Optional[int]:
    """Tokens one multi-turn episode may hold: task.max_episode_tokens, or the model's context;
    None for a single-turn task (no `task.env`)."""
    from orchestrator.config import env_spec
    if env_spec(cfg) is None:
        return None
    return cfg.task.max_episode_tokens or model_context(cfg)


def max_completion_tokens(cfg) -> int:
    """Longest completion: rollout.max_new_tokens; the sim backend emits min(that, its own)."""
    n = cfg.rollout.max_new_tokens
    if cfg.inference.backend == "sim":
        n = min(n, cfg.inference.sim.completion_tokens)
    return n
