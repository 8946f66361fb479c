"""Test helpers around orchestrator.data: a run config for a workload, its prompt set and a
`reward(row, completion_ids, is_eval)` that scores exactly as the inference worker's reward pool."""
from __future__ import annotations

from orchestrator.config import Config


def workload_config(**task) -> Config:
    model = task.pop("model", {})
    return Config.model_validate({"inference": {"backend": "torch"}, "actor": {"backend": "torch"},
                                  "eval": {"every_steps": 0}, "model": model, "task": task})


def prompts_and_reward(cfg: Config):
    from orchestrator.data.tokens import completion_text, load_tokens
    from orchestrator.data.workload import load_prompts, load_scorer

    prompts = load_prompts(cfg)
    tokens = load_tokens(cfg.model.path)
    rows, _, fn = load_scorer(cfg, tokens)

    def reward(row: int, ids, is_eval: bool = False) -> float:
        ids = [int(t) for t in ids]
        return fn(completion_text(tokens, ids), rows(is_eval, row), ids)

    return prompts, reward


class DigitTask:
    """A built-in digit task on the generic path, as in-process backend tests use it:
    `train_prompt(index) -> (prompt_id, ids)` and `reward(prompt_id, completion_ids, eval)`."""

    def __init__(self, name: str = "copy2", seed: int = 0, **task):
        cfg = workload_config(name=name, **task)
        cfg.run.seed = seed
        self.prompts, self._reward = prompts_and_reward(cfg)

    def train_prompt(self, index: int):
        pid, ids, _ = self.prompts.train_prompt(index)
        return pid, ids

    def reward(self, prompt_id: int, completion, eval: bool = False) -> float:
        assert not eval, "eval rows: use prompts.eval_prompts()"
        return self._reward(self.prompts.train_row(prompt_id), completion, False)
