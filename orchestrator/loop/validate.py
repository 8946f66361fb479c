"""Boundary check of every rollout group against the request it answers.

A group with the wrong sample count (a multi-turn training group may hold an agent episode's
extra branches beyond it: `envs.base.BRANCHES`, at most MAX_BRANCHES sequences an episode), a non-finite reward, logprobs that are not log-probabilities,
samples that do not start with their prompt, completions longer than asked, or loss-masked prompt
tokens is bad environment/backend output: the run stops with one line naming it (exit 2).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from orchestrator import messages
from orchestrator.envs.base import BRANCHES, MAX_BRANCHES
from orchestrator.errors import RunFailed
from shm.codec import Sequences


def check_rollout(g: Sequences, req: messages.Generate, episode_tokens: Optional[int] = None) -> None:
    """A rollout group must answer its request; anything else is bad env/backend output (exit 2).
    `episode_tokens`: a multi-turn task's budget; its samples open with the environment's messages
    (not the request's prompt) and may hold up to that many tokens in all."""
    def bad(what: str):
        raise RunFailed(f"bad rollout for request {req.request_id} (prompt {req.prompt_id}): {what}", 2)

    branches = int(g.scalars[BRANCHES]) if episode_tokens is not None and g.scalars.size > BRANCHES else 0
    if g.n - branches != req.n or not 0 <= branches <= req.n * (MAX_BRANCHES - 1) \
            or (branches and req.eval):
        bad(f"{g.n} samples, expected {req.n} (rollout.group_size, or eval.samples_per_prompt)"
            + (f" and {branches} agent branches" if branches else ""))
    if not np.isfinite(g.rewards).all():
        bad(f"non-finite reward {g.rewards[~np.isfinite(g.rewards)][0]}")
    if not np.isfinite(g.logprobs).all() or (g.logprobs > 1e-4).any():
        bad("logprobs must be finite and <= 0")
    p = len(req.prompt_tokens)
    for i in range(g.n):
        sl = g.seq(i)
        if episode_tokens is not None:
            p = int(g.prompt_lens[i])
            if sl.stop - sl.start > episode_tokens:
                bad(f"sample {i} has more than task.max_episode_tokens={episode_tokens} tokens")
        elif int(g.prompt_lens[i]) != p or not np.array_equal(g.tokens[sl][:p], req.prompt_tokens):
            bad(f"sample {i} does not start with the prompt it was asked for")
        elif sl.stop - sl.start - p > req.max_new_tokens:
            bad(f"sample {i} has more than max_new_tokens={req.max_new_tokens} completion tokens")
        if g.loss_mask[sl][:p].any():
            bad(f"sample {i} has loss-masked prompt tokens")
