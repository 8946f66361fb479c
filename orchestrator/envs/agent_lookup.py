"""The built-in `lookup` task played by an agent over HTTP: `task.agent: orchestrator.envs.agent_lookup:run`.

Contract: `run(row, base_url, api_key) -> float` (an `async def`: it awaits `AsyncOpenAI` on the
environment loop, no thread per episode) plays one episode of the built-in `lookup` task
(`envs.lookup`) through the worker's OpenAI-compatible endpoint, with the same rules and the same
reward as the in-process `LookupEnv` (default env_args: no tool latency, the key not required):
- the user message is the row's prompt ("47>");
- a model turn starting with "|" is a tool call: the agent sends the turn back as returned and the
  tool's reply "=VV>" (VV: the episode's hidden value, drawn once per episode), and calls again,
  at most `MAX_CALLS` calls (the run's `task.max_turns` also ends the episode at the endpoint);
- any other turn is the answer. Reward: 0 without a tool call or when the last turn is a call;
  else 0.1 for the call, 0.1 more when the first call is exactly "|" and its stop, and 0.8 x (of
  the value's two digits and the stop after them, positions right) / 3 (`envs.lookup.positions`).
It exists so that the in-process environment and the HTTP path can be compared on one task
(`scripts/bench_pipeline.py --backend agent`, tests/integration/test_agent_learns.py) and as a
worked example of an agent. Imports openai (the `agent` extra) only when an episode runs.
"""
from __future__ import annotations

import asyncio
import random
import weakref

from orchestrator.envs.lookup import CALL, CALL_CREDIT, CLEAN_CREDIT, END, REPLY

MODEL = "policy"
MAX_CALLS = 8            # a bound of the agent's own; the run's task.max_turns ends it earlier


def score(turns: list[tuple[str, str]], value: str) -> float:
    """The in-process environment's reward over the (text, finish_reason) of the model's turns."""
    if not turns or not turns[0][0].startswith(CALL) or turns[-1][0].startswith(CALL):
        return 0.0
    first, (text, finish) = turns[0], turns[-1]
    clean = first[0] == CALL and first[1] == "stop"
    right = sum(1 for a, b in zip(text[:2], value) if a == b) + (len(text) == 2 and finish == "stop")
    return CALL_CREDIT + CLEAN_CREDIT * clean + (1 - CALL_CREDIT - CLEAN_CREDIT) * right / 3


_HTTP: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _http():
    """One connection pool per event loop, shared by that loop's episodes: an `AsyncOpenAI` with a
    pool of its own costs ~70 ms to build (an SSL context), more than an episode of the tiny model
    (measured: 9 s of 128-episode steps, against 0.5 s with the pool shared). It lives as long as
    its loop (the worker's environment loop: the process)."""
    from openai import DefaultAsyncHttpxClient

    loop = asyncio.get_running_loop()
    if loop not in _HTTP:
        _HTTP[loop] = DefaultAsyncHttpxClient()
    return _HTTP[loop]


async def run(row, base_url: str, api_key: str) -> float:
    from openai import AsyncOpenAI

    value = f"{random.randrange(100):02d}"
    msgs: list = [{"role": "user", "content": str(row["prompt"])}]
    turns: list[tuple[str, str]] = []
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120, http_client=_http())
    for _ in range(MAX_CALLS):
        r = await client.chat.completions.create(model=MODEL, messages=msgs)
        choice = r.choices[0]
        text = choice.message.content or ""
        turns.append((text, choice.finish_reason))
        if not text.startswith(CALL):
            break
        msgs += [{"role": "assistant", "content": text}, {"role": "tool", "content": f"{REPLY}{value}{END}"}]
    return score(turns, value)
