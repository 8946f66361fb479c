"""The workload builder: the one place that turns `task.*` and `model.path` into what the
supervisor and the workers use. Construction reads in one direction: config -> this module -> the
model's tokens (`data.tokens`), the datasets (`data.digits`, `data.prompt_set`), the reward
(`data.rewards`, `data.reward_pool`) and the environment (`envs.registry`, `envs.render`,
`envs.runner`); none of those imports this module or each other upward.

Contract:
- `build_task(cfg)` (supervisor, at launch): the prompt source. The `sim` task is `SimPrompts`
  (random token prompts of `inference.sim.prompt_tokens`; the sim backend decides rewards); every
  other task, built-in digit task or `task.dataset`, is `load_prompts(cfg)`. Both expose
  `max_prompt_tokens` (the rings are sized from it), `train_prompt(index)`, `eval_prompts()`,
  `filtered` and `identity` (`backends.base.Task`).
- `build_scorer(cfg, tokens, seed)` (inference worker, with the model's tokens its backend loaded):
  the reward pool (`data.reward_pool.RewardPool`), or for a multi-turn task (`task.env`) the episode
  runner (`envs.runner.EpisodeRunner`) whose environment scores; for `task.agent`, the runner with
  the agent's episode body (`envs.agent.AgentEpisodes`: the worker's HTTP endpoint).
- `datasets_for(cfg) -> (train, eval)`: the built-in digit task's generated datasets, or
  `task.dataset` / `task.eval_dataset` opened with `prompt_set.open_dataset` (eval None when unset);
  `mixture_sources(cfg)` the same for each source of `task.datasets` (a `data.mixture.Mixture`
  is then the prompt source, each source's reward its own or task.reward).
- `load_prompts(cfg) -> PromptSet` (supervisor, at launch before anything starts): the model's
  tokens, the datasets, the reward resolved (so a bad `task.reward` fails here), every prompt rendered
  once and measured. Raises `DataError` (exit 2) naming the field.
- `load_scorer(cfg, tokens) -> (rows, reward name, reward fn)` (inference worker, with the model's
  tokens its backend loaded): the same datasets without rendering; `rows(eval, row) -> dict` reads
  one row (memory-mapped; `load_rows(cfg)` alone for a multi-turn task, whose environment scores).
  A multi-turn task (`task.env`) resolves its environment at launch instead of a reward.
"""
from __future__ import annotations

import numpy as np

from orchestrator.data.digits import DEFAULT_EVAL
from orchestrator.data.tokens import DataError, PromptRenderer, load_tokens, rendering_line

NO_ROW = -1         # a prompt with no dataset row (sim)


class SimPrompts:
    def __init__(self, prompt_tokens: int, num_train: int, num_eval: int, seed: int):
        self.prompt_tokens, self.num_train, self.num_eval, self.seed = (
            prompt_tokens, num_train, num_eval, seed)
        self.max_prompt_tokens = prompt_tokens
        self.filtered = 0
        self.identity = None          # a pure function of the config: nothing to compare

    def train_prompt(self, index: int) -> tuple[int, np.ndarray, int]:
        i = index % self.num_train
        rng = np.random.default_rng((self.seed, i))
        return i, rng.integers(0, 1000, self.prompt_tokens, dtype=np.int32), NO_ROW

    def eval_prompts(self) -> list[tuple[int, np.ndarray, int]]:
        rng = np.random.default_rng((self.seed, 0, 0xE7A1))     # a stream no train index uses
        return [(i, rng.integers(0, 1000, self.prompt_tokens, dtype=np.int32), NO_ROW)
                for i in range(self.num_eval)]


def build_task(cfg):
    if cfg.task.name == "sim":
        return SimPrompts(cfg.inference.sim.prompt_tokens, cfg.task.num_train_prompts,
                          cfg.task.num_eval_prompts or DEFAULT_EVAL, cfg.run.seed)
    return load_prompts(cfg)


def datasets_for(cfg):
    t = cfg.task
    if t.datasets is not None:
        raise ValueError("internal: a mixture's datasets are opened by source (mixture_sources)")
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
    _resolve_rendering(cfg, tokens)
    if env_spec(cfg) is not None:          # an environment scores its episodes: resolve it here,
        from orchestrator.envs.registry import resolve_agent, resolve_env   # so a bad task.env
        from orchestrator.envs.render import TurnRenderer                   # is exit 2
        if cfg.task.agent is not None:     # an agent, and the reward it may leave to task.reward
            agent = resolve_agent(cfg.task.agent)
            cfg.notes.extend(line for line in getattr(agent, "notes", ()) if line not in cfg.notes)
            if cfg.task.reward is not None:
                resolve_reward(cfg.task, tokens)
        else:
            resolve_env(env_spec(cfg))
        TurnRenderer(tokens, cfg.task)
        needs_answer = False
    elif cfg.task.datasets is None:
        name, _ = resolve_reward(cfg.task, tokens)
        needs_answer = name in NEEDS_ANSWER
    if cfg.task.datasets is not None:
        prompts = _load_mixture(cfg, tokens, env_spec(cfg) is None)
        _note_unknown(cfg, tokens, prompts.sets[0].renderer)
        return prompts
    train, evl = datasets_for(cfg)
    limit = cfg.task.num_eval_prompts if cfg.task.dataset is not None else None
    renderer = PromptRenderer(tokens, cfg.task)
    prompts = PromptSet(train, evl, renderer, cfg.task, cfg.run.seed, eval_limit=limit,
                        needs_answer=needs_answer)
    _note_unknown(cfg, tokens, renderer)
    return prompts


def _note_unknown(cfg, tokens, renderer) -> None:
    if renderer.unknown_prompts:
        seen = sorted(renderer.unknown_seen)
        shown = ", ".join(repr(c) for c in seen[:20]) + (", ..." if len(seen) > 20 else "")
        cfg.notes.append(f"{renderer.unknown_prompts} prompts hold characters the tokenizer has no "
                         f"token for ({shown}); they train as {tokens.tokenizer.unk_token!r} "
                         f"(task.unknown_chars=warn)")


def mixture_sources(cfg):
    """[(label, train, eval or None)] of `task.datasets`, opened (`prompt_set.open_dataset`)."""
    from orchestrator.data.prompt_set import open_dataset
    out = []
    for i, d in enumerate(cfg.task.datasets):
        train = open_dataset(d.path, f"task.datasets[{i}].path")
        evl = open_dataset(d.eval_path, f"task.datasets[{i}].eval_path") \
            if d.eval_path is not None else None
        out.append((d.label, train, evl))
    return out


def _source_rewards(cfg, tokens) -> dict:
    """label -> (reward name, fn) of each mixture source (its own reward, else task.reward)."""
    from orchestrator.data.rewards import resolve_reward
    out = {}
    for i, d in enumerate(cfg.task.datasets):
        own = cfg.task.model_copy(update={"reward": d.reward or cfg.task.reward})
        try:
            out[d.label] = resolve_reward(own, tokens)
        except DataError as exc:
            where = f"task.datasets[{i}].reward" if d.reward else "task.reward"
            raise DataError(f"{where} of source {d.label!r}: {exc}") from None
    return out


def _load_mixture(cfg, tokens, rewarded: bool):
    from orchestrator.data.mixture import Mixture, source_seed
    from orchestrator.data.prompt_set import PromptSet
    from orchestrator.data.rewards import NEEDS_ANSWER

    rewards = _source_rewards(cfg, tokens) if rewarded else {}
    renderer = PromptRenderer(tokens, cfg.task)
    sets = []
    for i, (label, train, evl) in enumerate(mixture_sources(cfg)):
        needs = label in rewards and rewards[label][0] in NEEDS_ANSWER
        sets.append(PromptSet(train, evl, renderer, cfg.task, source_seed(cfg.run.seed, i),
                              eval_limit=cfg.task.num_eval_prompts, needs_answer=needs,
                              names=(f"task.datasets[{i}].path", f"task.datasets[{i}].eval_path")))
    d = cfg.task.datasets
    return Mixture(sets, [x.label for x in d], [x.weight for x in d], cfg.run.seed,
                   cfg.task.num_train_prompts)


def _resolve_rendering(cfg, tokens) -> None:
    """`task.apply_chat_template=auto` becomes what the tokenizer allows (config.yaml keeps that
    value); a run on an HF tokenizer says so at start."""
    chat = bool(getattr(tokens.tokenizer, "chat_template", None))
    line = rendering_line(cfg.task, chat)
    if line is None:
        return
    from orchestrator.config import env_spec
    cfg.task.apply_chat_template = chat
    if cfg.model.path is not None and (cfg.task.agent is not None or env_spec(cfg) is None):
        cfg.say(line)       # an environment's messages are always rendered with the template


def load_rows(cfg):
    """`rows(eval, row) -> dict`: one dataset row, memory-mapped (inference workers); a
    mixture's carries `data_source`, its source's name (`data.mixture`)."""
    if cfg.task.datasets is not None:
        from orchestrator.data.mixture import MixtureRows
        opened = mixture_sources(cfg)
        return MixtureRows([t for _, t, _ in opened], [e for _, _, e in opened],
                           [x for x, _, _ in opened])
    train, evl = datasets_for(cfg)

    def rows(is_eval: bool, row: int) -> dict:
        return (evl if is_eval else train)[int(row)]
    return rows


def load_scorer(cfg, tokens):
    from orchestrator.data.rewards import resolve_reward

    if cfg.task.datasets is not None:
        from orchestrator.data.mixture import by_source
        got = _source_rewards(cfg, tokens)
        name = ", ".join(f"{label}: {n}" for label, (n, _) in got.items())
        return load_rows(cfg), name, by_source({label: fn for label, (_, fn) in got.items()})
    name, fn = resolve_reward(cfg.task, tokens)
    return load_rows(cfg), name, fn


def build_scorer(cfg, tokens, seed: int):
    from orchestrator.config import env_spec
    if env_spec(cfg) is None:
        from orchestrator.data.reward_pool import RewardPool
        rows, name, fn = load_scorer(cfg, tokens)
        t = cfg.task
        return RewardPool(fn, name, tokens, rows, t.reward_workers, t.reward_timeout_s, t.reward_on_error)
    from orchestrator.data.budgets import episode_tokens
    from orchestrator.envs.registry import resolve_env
    from orchestrator.envs.render import TurnRenderer
    from orchestrator.envs.runner import EpisodeRunner, Limits

    t = cfg.task
    limits = Limits(t.max_turns, cfg.rollout.max_new_tokens, episode_tokens(cfg), t.env_timeout_s,
                    t.env_on_error, t.env_workers, t.env_processes)
    if t.agent is not None:
        return EpisodeRunner(None, {}, TurnRenderer(tokens, t), tokens, load_rows(cfg), limits,
                             t.agent, seed, agent=_agent(cfg, tokens))
    return EpisodeRunner(resolve_env(env_spec(cfg)), t.env_args, TurnRenderer(tokens, t), tokens,
                         load_rows(cfg), limits, env_spec(cfg), seed)


def _agent(cfg, tokens):
    """`task.agent`'s episode body (envs.agent): its function, the row's prompt as the supervisor
    renders it (an episode that never calls the endpoint), `task.reward` when set."""
    from orchestrator.data.rewards import resolve_reward
    from orchestrator.envs.agent import AgentEpisodes
    from orchestrator.envs.registry import resolve_agent

    t = cfg.task
    renderer = PromptRenderer(tokens, t)
    reward = resolve_reward(t, tokens)[1] if t.reward is not None else None
    names = ("policy",) + ((cfg.model.path,) if cfg.model.path else ())
    return AgentEpisodes(resolve_agent(t.agent), lambda row: renderer.ids(row[t.prompt_field]).tolist(),
                         reward, t.agent_timeout_s, min(256, cfg.rollout.concurrency * cfg.rollout.group_size),
                         names)
