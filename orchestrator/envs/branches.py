"""An agent episode's conversation branches (envs.agent_session's data): token trajectories that
grow by appending, are cut back, and fork at recorded points.

Contract: `Branch` holds one trajectory (ids, loss mask, logprobs, versions, the prompt length),
the renderer's state and the rendered history; `append(ids, mask, logprobs, versions)` adds ids
(context: mask 0, logprob 0, version -1), `cut(n)` keeps the first n ids (and the fork points at or
before them), `fork(point)` is a new branch sharing this one's first `point.n` ids and `point.k`
messages. `Point`: where a branch can be forked. `_Prompt`: a turn's prompt as
`EpisodeRunner.generate` takes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Point:
    """Where a branch can be forked: its first `n` ids and first `k` messages; `turn_ids` set after
    a model turn (then `state` is the renderer's state before that turn's text), None before one."""
    n: int
    k: int
    state: object
    turn_ids: Optional[list[int]] = None


@dataclass
class _Prompt:
    """A turn's prompt as `EpisodeRunner.generate` takes it (it adds the turn's time to gen_s)."""
    ids: list
    gen_s: float = 0.0
    index: int = 0          # its episode's place in the group
    asked: int = 0


@dataclass
class Branch:
    ids: list = field(default_factory=list)
    mask: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    versions: list = field(default_factory=list)
    prompt_len: int = 0
    state: object = None                 # the renderer's state (chat)
    history: list = field(default_factory=list)    # the conversation as rendered (turns: raw text)
    returned: dict = field(default_factory=dict)   # history index -> the assistant message returned
    turn_ids: list = field(default_factory=list)   # the last turn's sampled ids
    points: list = field(default_factory=list)
    busy: bool = False                   # a call of it is in flight
    undo: tuple = ()                     # what its call in flight takes back if it fails
    reserve: int = 0                     # the most tokens its turn in flight may add

    def append(self, ids, mask: int, logprobs=None, versions=None) -> None:
        self.ids += ids
        self.mask += [mask] * len(ids)
        self.logprobs += [0.0] * len(ids) if logprobs is None else logprobs
        self.versions += [-1] * len(ids) if versions is None else versions

    def cut(self, n: int) -> None:
        del self.ids[n:], self.mask[n:], self.logprobs[n:], self.versions[n:]
        self.points = [p for p in self.points if p.n <= n]

    def fork(self, p: Point) -> "Branch":
        k = p.k
        return Branch(self.ids[:p.n], self.mask[:p.n], self.logprobs[:p.n], self.versions[:p.n],
                      self.prompt_len, p.state, self.history[:k],
                      {i: m for i, m in self.returned.items() if i < k},
                      list(p.turn_ids or []), [q for q in self.points if q.n <= p.n])
