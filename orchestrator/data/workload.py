"""One place that turns `task.*` and `model.path` into what the supervisor and the workers use.

Contract:
- `datasets_for(cfg) -> (train, eval)`: the built-in digit task's generated datasets, or
  `task.dataset` / `task.eval_dataset` opened with `prompt_set.open_dataset` (eval None when unset).
- `load_prompts(cfg) -> PromptSet` (supervisor, at launch before anything starts): the model's
  tokens, the datasets, the reward resolved (so a bad `task.reward` fails here), every prompt rendered
  once and measured. Raises `DataError` (exit 2) naming the field.
- `load_scorer(cfg, tokens) -> (rows, reward name, reward fn)` (inference worker, with the model's
  tokens its backend loaded): the same datasets without rendering; `rows(eval, row) -> dict` reads
  one row (memory-mapped; `load_rows(cfg)` alone for a multi-turn task, whose environment scores).
  A multi-turn task (`task.env`) resolves its environment at launch instead of a reward.
"""
from __future__ import annotations

from orchestrator.data.tokens import DataError, PromptRenderer, load_tokens


def datasets_for(cfg):
    t = cfg.task
    if t.dataset is None:
        from orchestrator.data.digits import digit_datasets
        return digit_datasets(t.name, t.num_eval_prompts, cfg.run.seed)
    from orchestrator.data.prompt_set import open_dataset
    train = open_dataset(t.dataset, "task.dataset")
    evl = open_dataset(t.eval_dataset, "task.eval_dataset") if t.eval_dataset is not None else None
    return train, evl


def _tokens(cfg):
    try:
        return load_tokens(cfg.model.path)
    except DataError:
        raise
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        raise DataError(f"model.path={cfg.model.path}: cannot load its tokenizer ({why})") from None


def load_prompts(cfg):
    from orchestrator.config import env_spec
    from orchestrator.data.prompt_set import PromptSet
    from orchestrator.data.rewards import NEEDS_ANSWER, resolve_reward

    tokens = _tokens(cfg)
    if env_spec(cfg) is not None:          # an environment scores its episodes: resolve it here,
        from orchestrator.envs.base import resolve_env      # so a bad task.env is exit 2
        from orchestrator.envs.render import TurnRenderer
        resolve_env(env_spec(cfg))
        TurnRenderer(tokens, cfg.task)
        needs_answer = False
    else:
        name, _ = resolve_reward(cfg.task, tokens)
        needs_answer = name in NEEDS_ANSWER
    train, evl = datasets_for(cfg)
    limit = cfg.task.num_eval_prompts if cfg.task.dataset is not None else None
    return PromptSet(train, evl, PromptRenderer(tokens, cfg.task), cfg.task, cfg.run.seed,
                     eval_limit=limit, needs_answer=needs_answer)


def load_rows(cfg):
    """`rows(eval, row) -> dict`: one dataset row, memory-mapped (inference workers)."""
    train, evl = datasets_for(cfg)

    def rows(is_eval: bool, row: int) -> dict:
        return (evl if is_eval else train)[int(row)]
    return rows


def load_scorer(cfg, tokens):
    from orchestrator.data.rewards import resolve_reward

    name, fn = resolve_reward(cfg.task, tokens)
    return load_rows(cfg), name, fn
