"""An environment task's episode body and a finished group's record, for `envs.runner.EpisodeRunner`.

Contract: `env_episode(runner, group, ep) -> reward` is the body of one episode of an environment
task (`task.env`; an agent task's is `envs.agent.AgentEpisodes.episode`, with the same runner
calls): the environment built from `runner.env_cls(**runner.env_args)` with its rng keyed by the
group's key + (episode, ENV_STREAM) under run.deterministic (else spawned from `runner.seeds`),
then reset -> (model turn, step, rendered reply)* -> score, every blocking call through
`runner.call` (bounded by task.env_timeout_s), each model turn through `runner.generate`; a limit
raises `Ended`, bad environment output `EnvError` (see the runner's contract).
`Ended(reason)` (a limit: 'limited' or 'rejected') and `EnvError` (an environment call raised or
returned something unusable) are what episode bodies raise. `group_record(group, episodes) ->
Sequences`: the group's record: one sequence per episode, then
(training groups) each episode's other branches with its episode's reward; scalars summed over the
episodes (`envs.base.SCALARS`).
"""
from __future__ import annotations

import numpy as np

from orchestrator.data.reward_pool import REWARD_ERRORS
from orchestrator.data.tokens import completion_text
from orchestrator.envs.base import (BRANCHES, ENV_S, GEN_S, LIMITED, REJECTED, SCALARS, TOOL_CALLS,
                                    TURNS, TURNS_MAX, ModelTurn, StepResult)
from orchestrator.envs.render import AppendError, TooLong
from shm.codec import Sequences

ENV_STREAM = (1 << 32) - 1  # keyed env rng: key + (episode, ENV_STREAM), no turn index reaches it


class Ended(Exception):
    """An episode ended by a limit (reason: 'limited' or 'rejected')."""

    def __init__(self, reason: str):
        self.reason = reason


class EnvError(Exception):
    """An environment call raised or returned something unusable (one line, names env and row)."""


async def env_episode(runner, g, ep) -> float:
    """An environment task's episode on `runner` (an EpisodeRunner): reset -> (turn, step, reply)*
    -> score: the reward (Ended / EnvError otherwise)."""
    lim = runner.limits
    try:
        ep.env = env = runner.env_cls(**runner.env_args)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise EnvError(f"{runner.where(g)}: constructing it with task.env_args raised {why}") from None
    env.rng = np.random.default_rng([*g.key, ep.index, ENV_STREAM] if g.key
                                    else runner.seeds.spawn(1)[0])
    env._pool = runner.pool
    row = runner.rows(g.is_eval, g.row)
    history = await runner.call(g, ep, "reset()", env.reset, row)
    try:
        ep.ids, state = await runner.rendered(runner.renderer.opening, history,
                                            getattr(env, "tools", None), lim.max_episode_tokens)
    except TooLong:
        raise Ended("limited") from None
    except (AppendError, TypeError) as exc:
        raise EnvError(f"{runner.where(g)}: reset() returned messages that cannot be "
                       f"rendered ({exc})") from None
    history = list(history)
    ep.prompt_len = len(ep.ids)
    ep.mask = [0] * len(ep.ids)
    ep.logprobs = [0.0] * len(ep.ids)
    ep.versions = [-1] * len(ep.ids)
    while True:
        left = lim.max_episode_tokens - len(ep.ids)
        if ep.turns >= lim.max_turns or left <= 0:
            raise Ended("limited")
        ids, lps, vers = await runner.generate(g, ep, min(lim.max_new_tokens, left))
        ep.turns += 1
        ep.ids += ids
        ep.mask += [1] * len(ids)
        ep.logprobs += lps
        ep.versions += vers
        stopped = bool(ids) and ids[-1] in runner.tokens.stop_ids
        turn = ModelTurn(completion_text(runner.tokens, ids), ids, stopped)
        history.append({"role": "assistant", "content": turn.text})
        res = await runner.call(g, ep, "step()", env.step, turn)
        if not isinstance(res, StepResult):
            raise EnvError(f"{runner.where(g)}: step() returned {type(res).__name__}, "
                           f"not a StepResult")
        ep.tool_calls += float(res.metrics.get("tool_calls", 0.0))
        if res.done:
            break
        try:
            reply = await runner.rendered(runner.renderer.reply, state, history, ids, res.messages,
                                        lim.max_episode_tokens - len(ep.ids))
        except TooLong:
            raise Ended("limited") from None
        except AppendError:
            raise Ended("rejected") from None
        except TypeError as exc:
            raise EnvError(f"{runner.where(g)}: step() returned a bad reply ({exc})") from None
        if len(ep.ids) + len(reply) > lim.max_episode_tokens:
            raise Ended("limited")
        history += res.messages
        ep.ids += reply
        ep.mask += [0] * len(reply)
        ep.logprobs += [0.0] * len(reply)
        ep.versions += [-1] * len(reply)
    return runner.reward(g, "score()", await runner.call(g, ep, "score()", env.score, history))


def group_record(g, eps: list) -> Sequences:
    """The group's record: one sequence per episode, then (training groups) each episode's
    other branches, each with its episode's reward; an eval group holds the first branches."""
    seqs = [(e, e) for e in eps]
    if not g.is_eval:
        seqs += [(b, e) for e in eps if e.ended != "rejected" for b in e.extra]
    lens = np.array([len(s.ids) for s, _ in seqs], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    cat = lambda attr, dt: np.array([x for s, _ in seqs for x in getattr(s, attr)], dt)   # noqa: E731
    loss_mask, versions = cat("mask", np.uint8), cat("versions", np.int32)
    live = versions[loss_mask.astype(bool)]
    scalars = np.zeros(len(SCALARS), np.float64)
    scalars[REWARD_ERRORS] = sum(e.ended == "error" for e in eps)
    scalars[TURNS] = sum(e.turns for e in eps)
    scalars[TURNS_MAX] = max(e.turns for e in eps)
    scalars[ENV_S] = sum(e.env_s for e in eps)
    scalars[GEN_S] = sum(e.gen_s for e in eps)
    scalars[TOOL_CALLS] = sum(e.tool_calls for e in eps)
    scalars[LIMITED] = sum(e.ended == "limited" for e in eps)
    scalars[REJECTED] = sum(e.ended == "rejected" for e in eps)
    scalars[BRANCHES] = len(seqs) - len(eps)
    return Sequences(
        kind=1 if g.is_eval else 0, ident=g.request_id, version=int(live.min()) if live.size else -1,
        offsets=offsets, prompt_lens=np.array([s.prompt_len for s, _ in seqs], np.int32),
        prompt_ids=np.full(len(seqs), g.prompt_id, np.int64), tokens=cat("ids", np.int32),
        logprobs=cat("logprobs", np.float32), versions=versions, loss_mask=loss_mask,
        rewards=np.array([e.reward for _, e in seqs], np.float32),
        advantages=np.zeros(len(seqs), np.float32), scalars=scalars)
