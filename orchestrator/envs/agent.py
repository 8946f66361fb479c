"""Agents over HTTP (`task.agent`): an episode is the user's agent talking to the worker's endpoint.

Contract: `AgentEpisodes(fn, prompts, reward, timeout_s, workers, model_names)` is the episode body
of an `EpisodeRunner` (its `agent`): `open(runner)` starts the worker's endpoint
(`envs.endpoint`, 127.0.0.1, an ephemeral port) on the runner's loop, `episode(runner, group, ep)`
runs one episode, `aclose()` stops the endpoint. One episode:
- a fresh key (random, 128 bits) and a `Session` (`envs.agent_session`) registered under it;
- `fn(row, base_url, api_key)` with the dataset row, `{endpoint}/e/{key}/v1` and the key: an
  `async def` runs as a task on the environment loop (it must await: a blocking client inside
  `async def` blocks the loop that serves it, and is reported as a hang, `task.env_on_hang`), a
  plain function on a thread of this body's own pool (`workers` threads: the episodes one worker
  can hold at once), each under `task.agent_timeout_s` (past it: limited, reward 0; a thread that
  does not return is abandoned and replaced). Many plain agents start at once: a library whose
  first use is not thread-safe fails there (openai's lazily built pydantic models:
  `DEFER_PYDANTIC_BUILD=false` before importing it, README);
- the session is closed (later calls: 404; a call in flight is cancelled, its turn aborted and taken
  back, waited for at most `agent_session.CLOSE_S`);
- the outcome, in order: a call that ended the episode (limited or rejected: `ended`) decides it,
  whatever the agent did after; an agent that raised is an environment error (`task.env_on_error`:
  exit 2 naming the agent and the row, or reward 0 counted as reward_errors); an agent that never
  called the endpoint leaves an episode with no model token: its trajectory is the row's prompt
  as the supervisor renders it, all context, and it counts as `rollouts_rejected` (nothing to
  train, out of its group's baseline); else its return value is the reward, or with None,
  `task.reward` scores the transcript: `fn(text, row, ids)` with the ids after the first call's
  prompt (model turns and what the agent appended between them) and their text, on the runner's
  call pool under `task.env_timeout_s` (None without `task.reward`: an environment error).
The step line's `tool_calls` counts the tool calls the endpoint parsed out of the model's turns.
The session's other branches (concurrent or forked calls) go to `ep.extra`: trained with the same
reward (a None result scores the first branch's transcript).
"""
from __future__ import annotations

import asyncio
import inspect
import secrets
import time
from typing import Callable, Optional

from orchestrator.data.tokens import completion_text
from orchestrator.envs.agent_session import Session
from orchestrator.envs.endpoint import Endpoint
from orchestrator.envs.pool import EnvPool
from orchestrator.envs.episodes import Ended, EnvError

SWEEP_S = 0.25


class AgentEpisodes:
    def __init__(self, fn: Callable, prompts: Callable[[dict], list[int]], reward: Optional[Callable],
                 timeout_s: float, workers: int, model_names: tuple[str, ...]):
        self.fn, self.prompts, self.reward, self.timeout_s = fn, prompts, reward, timeout_s
        self.is_async = inspect.iscoroutinefunction(fn)
        self.sessions: dict[str, Session] = {}
        self.endpoint = Endpoint(self.sessions, model_names)
        self.pool = None if self.is_async else EnvPool(workers, "agent")
        self._sweeper: Optional[asyncio.TimerHandle] = None

    async def open(self, runner) -> None:
        await self.endpoint.start()
        if self.pool is not None:
            self._sweep()

    def _sweep(self) -> None:
        """Abandon plain agents past the timeout (their threads replaced), every SWEEP_S."""
        self.pool.sweep(self.timeout_s)
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for s in list(self.sessions.values()):
            s.close()
        await self.endpoint.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    async def episode(self, runner, g, ep) -> float:
        key = secrets.token_hex(16)
        session = self.sessions[key] = Session(key, runner, g, ep, model=self.endpoint.model_names[0])
        row = runner.rows(g.is_eval, g.row)
        what = f"run() of {runner.where(g)}"
        t0 = time.monotonic()
        try:
            result, error = await self._run(runner, what, row, self.endpoint.base_url(key), key)
        finally:
            try:
                await session.aclose()         # calls in flight take their turns back first
            finally:
                del self.sessions[key]
            ep.env_s += max(0.0, time.monotonic() - t0 - ep.gen_s)     # the agent's own time
        ep.tool_calls += session.tool_calls
        ep.extra = session.extra()
        if session.ended is not None:
            raise Ended(session.ended)
        if error is not None:
            raise error
        if not ep.ids:             # never called the endpoint: nothing sampled, nothing to train
            ids = await runner.rendered(self.prompts, row)
            ep.ids, ep.prompt_len = list(ids), len(ids)
            ep.mask, ep.logprobs, ep.versions = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids)
            raise Ended("rejected")
        if result is None:
            if self.reward is None:
                raise EnvError(f"{runner.where(g)}: run() returned None and task.reward is unset "
                               f"(return the reward, or set task.reward)")
            ids = ep.ids[ep.prompt_len:]
            text = await runner.rendered(completion_text, runner.tokens, ids)
            result = await runner.call(g, ep, "task.reward", self.reward, text, row, ids)
            return runner.reward(g, "task.reward", result)
        return runner.reward(g, "run()", result)

    async def _run(self, runner, what: str, row: dict, base_url: str, key: str):
        """The agent's run: (its return value, None) or (None, Ended / EnvError)."""
        try:
            if self.is_async:
                task = asyncio.ensure_future(self.fn(row, base_url, key))
                runner.watching(task, what)          # named if it blocks the loop (a hang)
                return await asyncio.wait_for(task, self.timeout_s), None
            fut = self.pool.call(what, self.fn, row, base_url, key)
            return await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout_s + 2 * SWEEP_S), None
        except (asyncio.TimeoutError, TimeoutError):
            return None, Ended("limited")
        except asyncio.CancelledError:
            raise
        except Exception as exc:                 # noqa: BLE001 - the agent's own error, reported
            why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            return None, EnvError(f"{what[len('run() of '):]}: run() raised {why}")
