"""The built-in tool task `lookup`: call a tool to learn a hidden value, then answer with it.

Rows come from the built-in `lookup` prompts (`data.digits`): the prompt names a two-digit key
(`"47>"`), `answer` holds the key. Each episode draws a hidden two-digit value for every key (from
its own rng), so the value cannot be memorised. The tiny model's turn format, in its character
vocabulary:
  user       "47>"
  assistant  "|"  + eos        a tool call: look the prompt's key up (whatever follows "|";
                               with env_args `require_key: true`, the harder task, the call must
                               name the key, "|47": another key gets its own value, a malformed
                               one "=->")
  tool       "=83>"            the value
  assistant  "83"  + eos       the answer
Reward: 0 when the episode made no tool call (an answer without one is a guess); otherwise
0.1 for the call, 0.1 more when the first call is exactly the call and its stop, and 0.8 * (answer
positions right) / 3, positions being the two digits of the row key's value and the stop after them. A second call gets a second reply; `task.max_turns`
ends a loop.
Tool latency: `env_args` `latency_s` (mean seconds per call, default 0) and `latency_sigma`
(lognormal spread; 0: fixed), awaited without blocking other episodes.
"""
from __future__ import annotations

import asyncio
import math

from orchestrator.envs.base import Environment, ModelTurn, StepResult

CALL, REPLY, END = "|", "=", ">"
CALL_CREDIT, CLEAN_CREDIT = 0.1, 0.1      # a call; a call that is exactly "|" + stop (or "|KK")


def positions(got: ModelTurn, want: str) -> int:
    """Of the two characters of `want` and the stop after them, how many the turn got right."""
    return sum(1 for a, b in zip(got.text[:2], want) if a == b) + (len(got.text) == 2 and got.stopped)


class LookupEnv(Environment):
    def __init__(self, latency_s: float = 0.0, latency_sigma: float = 0.0, require_key: bool = False,
                 key_field: str = "answer"):
        self.latency_s, self.latency_sigma = float(latency_s), float(latency_sigma)
        self.require_key, self.key_field = bool(require_key), key_field
        self.values: dict[str, str] = {}
        self.key = ""
        self.called = self.clean = False
        self.last: ModelTurn | None = None

    def value(self, key: str) -> str:
        if key not in self.values:
            self.values[key] = f"{int(self.rng.integers(0, 100)):02d}"
        return self.values[key]

    async def reset(self, row: dict) -> list[dict]:
        self.key = str(row[self.key_field])
        return [{"role": "user", "content": str(row["prompt"])}]

    async def step(self, turn: ModelTurn) -> StepResult:
        self.last = turn
        if not turn.text.startswith(CALL):
            return StepResult(done=True)                       # an answer ends the episode
        if not self.called:
            self.clean = turn.stopped and len(turn.text) == (3 if self.require_key else 1)
        self.called = True
        if self.latency_s > 0:
            s = self.latency_sigma
            delay = self.latency_s * (math.exp(self.rng.normal(-s * s / 2, s)) if s > 0 else 1.0)
            await asyncio.sleep(delay)
        key = turn.text[len(CALL):] if self.require_key else self.key
        found = self.value(key) if len(key) == 2 and key.isdigit() else "-"
        return StepResult([{"role": "tool", "content": f"{REPLY}{found}{END}"}],
                          metrics={"tool_calls": 1.0})

    async def score(self, transcript: list[dict]) -> float:
        if not self.called or self.last is None or self.last.text.startswith(CALL):
            return 0.0
        answer = positions(self.last, self.value(self.key)) / 3
        return CALL_CREDIT + CLEAN_CREDIT * self.clean + (1 - CALL_CREDIT - CLEAN_CREDIT) * answer
