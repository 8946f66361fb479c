"""One place that turns `task.*` and `model.path` into what the supervisor and the workers use.

Contract:
- `datasets_for(cfg) -> (train, eval)`: the built-in digit task's generated datasets, or
  `task.dataset` / `task.eval_dataset` opened with `prompt_set.open_dataset` (eval None when unset).
- `load_prompts(cfg) -> PromptSet` (supervisor, at launch before anything starts): the model's
  tokens, the datasets, the reward resolved (so a bad `task.reward` fails here), every prompt rendered
  once and measured. Raises `DataError` (exit 2) naming the field.
- `load_scorer(cfg, tokens) -> (rows, reward name, reward fn)` (inference worker, with the model's
  tokens its backend loaded): the same datasets without rendering; `rows(eval, row) -> dict` reads
  one row (memory-mapped).
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
    from orchestrator.data.prompt_set import PromptSet
    from orchestrator.data.rewards import NEEDS_ANSWER, resolve_reward

    tokens = _tokens(cfg)
    name, _ = resolve_reward(cfg.task, tokens)
    train, evl = datasets_for(cfg)
    limit = cfg.task.num_eval_prompts if cfg.task.dataset is not None else None
    return PromptSet(train, evl, PromptRenderer(tokens, cfg.task), cfg.task, cfg.run.seed,
                     eval_limit=limit, needs_answer=name in NEEDS_ANSWER)


def load_scorer(cfg, tokens):
    from orchestrator.data.rewards import resolve_reward

    name, fn = resolve_reward(cfg.task, tokens)
    train, evl = datasets_for(cfg)

    def rows(is_eval: bool, row: int) -> dict:
        return (evl if is_eval else train)[int(row)]

    return rows, name, fn
