"""Multi-turn environments: the contract an environment implements.

An environment is ONE episode. It speaks messages (chat dicts `{"role", "content"}`); only the
inference worker touches tokens. The runner (`envs.runner`) creates one instance per episode with
`cls(**task.env_args)` and calls, each under `task.env_timeout_s`:
- `reset(row) -> list[dict]`: the opening messages for dataset row `row` (a dict); may draw hidden
  per-episode state (use `self.rng`, seeded per episode by the runner).
- `step(turn: ModelTurn) -> StepResult`: the model's turn (its text, decoded from the sampled ids
  without the stop token; the ids themselves; whether it ended on a stop token) -> the reply
  messages appended to the conversation (role `tool` or `user`), `done`, and per-turn `metrics`
  (numbers; `tool_calls` is summed into the step line).
- `score(transcript) -> float`: the episode's reward, given every message so far (the model's turns
  as role `assistant`).
- `close()`: always called once, however the episode ended.
Each of them may be `async def` (awaited on the environment thread's event loop: slow tools and
rewards wait without blocking anything; one that blocks instead of awaiting stalls every episode of
its worker and is a hang, `task.env_on_hang`) or a plain function (run on the runner's pool, so a
blocking call never stalls the loop; one past the timeout is abandoned and its thread replaced).
`await self.run_tool(fn, *args)` runs a blocking tool on that pool (a process pool with
`task.env_processes: true`: `fn` and its arguments must pickle). `tools`: optional
JSON schemas (OpenAI function format) passed to the chat template when the opening messages are
rendered.

The registry of built-in and user environments is `envs.registry` (it imports them; this
module imports none).
"""
from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np


# Sequences.scalars of a finished multi-turn group (index 0 is the reward pool's REWARD_ERRORS: calls
# that failed and scored 0); summed over the group's episodes, except TURNS_MAX (their max).
# BRANCHES: the sequences a group holds beyond one per episode (an agent episode's extra branches).
TURNS, TURNS_MAX, ENV_S, GEN_S, TOOL_CALLS, LIMITED, REJECTED, BRANCHES = range(1, 9)
SCALARS = {0: "reward_errors", TURNS: "turns", TURNS_MAX: "turns_max", ENV_S: "env_s", GEN_S: "gen_s",
           TOOL_CALLS: "tool_calls", LIMITED: "episodes_limited", REJECTED: "rollouts_rejected",
           BRANCHES: "branches"}
# the most branches (trained sequences) one agent episode may have (`envs.agent_session`); rings
# are sized for it (`runtime.resources`), the rollout check allows it (`loop.validate`)
MAX_BRANCHES = 8


@dataclass
class ModelTurn:
    text: str                  # decoded sampled ids, stop token removed
    ids: list[int]             # exactly the sampled ids (stop token included when there was one)
    stopped: bool              # ended on a stop token (False: the per-turn token limit cut it)


@dataclass
class StepResult:
    messages: list[dict] = field(default_factory=list)     # the reply, appended to the conversation
    done: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


class Environment:
    """Optional base class: per-episode `rng`, `run_tool`, empty `tools`, no-op `close`."""
    tools: Optional[list[dict]] = None

    rng: np.random.Generator = np.random.default_rng(0)    # replaced per episode by the runner
    _pool: Any = None                                       # the runner's executor

    async def run_tool(self, fn: Callable, *args):
        """Run a blocking (or CPU-heavy) tool call on the runner's pool and await its result."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def close(self) -> None:
        pass
