"""Train sink: finished groups -> advantages -> filter -> batch of B groups.

Groups are consumed in completion order. Advantages are `orchestrator.algo.compute_advantages` of the
configured estimator (`algo.advantage`, `algo.norm_by_std`; the default, grpo_population_std, is
(r - group mean) / (group population std + eps)) over the groups kept, each group one group_index;
a batch of single samples is one group (the batch is their baseline); a single sample in a batch of
groups gets 0. A sample with no loss-masked token (a multi-turn episode rejected by the append rule:
not trained) takes no part in a baseline and gets advantage 0; it stays in its group, so its prompt
is consumed once. With `filter_zero_std`, groups whose rewards (of samples with loss-masked tokens)
are all equal carry no signal and are dropped before the advantages (a singleton batch is dropped
only if every such reward in it is equal).
`trainable` is the number of samples left
that have at least one loss-masked token (`trainable_tokens` counts those tokens): a batch of empty
completions is not trainable. `reward_errors` sums the groups' `scalars[REWARD_ERRORS]` (reward calls
scored 0 after failing, set by the inference worker's reward pool or episode runner). Multi-turn
groups (`envs.base.SCALARS`) add `episode` fields to the step line: turns per episode (mean, max),
environment and generation seconds per episode (means), tool calls, episodes ended by a limit,
rollouts rejected by the append rule.
"""
from __future__ import annotations


from dataclasses import dataclass, replace

import numpy as np

from orchestrator.algo import compute_advantages
from orchestrator.data.reward_pool import REWARD_ERRORS
from orchestrator.envs.base import ENV_S, GEN_S, LIMITED, REJECTED, SCALARS, TOOL_CALLS, TURNS, TURNS_MAX
from shm.codec import Sequences, concat

EPS = 1e-6
BATCH_KIND = 2


@dataclass
class BatchInfo:
    step: int
    version: int
    groups: int
    trainable: int
    trainable_tokens: int
    reward_mean: float
    reward_errors: int       # reward calls that failed and scored 0 (task.reward_on_error=zero)
    consumed: Sequences      # every group taken for this batch, before filtering (for age stats)
    episode: dict            # multi-turn step-line fields (empty for single-turn groups)
    parts: list              # the groups themselves, in completion order


def _flat(r: np.ndarray, live: np.ndarray) -> bool:
    return not live.any() or np.ptp(r[live]) == 0


def _masked_per_seq(seqs: Sequences) -> np.ndarray:
    cum = np.concatenate(([0], np.cumsum(seqs.loss_mask, dtype=np.int64)))
    return cum[seqs.offsets[1:]] - cum[seqs.offsets[:-1]]


class TrainSink:
    def __init__(self, batch_size: int, filter_zero_std: bool,
                 estimator: str = "grpo_population_std", norm_by_std: bool = True):
        self.batch_size = batch_size
        self.filter_zero_std = filter_zero_std
        self.estimator, self.norm_by_std = estimator, norm_by_std
        self.pending: list[Sequences] = []

    def add(self, group: Sequences) -> None:
        self.pending.append(group)

    def ready(self) -> bool:
        return len(self.pending) >= self.batch_size

    def take_batch(self, step: int, version: int) -> tuple[Sequences, BatchInfo]:
        groups, self.pending = self.pending[:self.batch_size], self.pending[self.batch_size:]
        consumed = concat(groups, kind=BATCH_KIND, ident=step, version=version)
        rewards = consumed.rewards.astype(np.float64)
        lengths = _masked_per_seq(consumed)
        live = lengths > 0
        starts = np.cumsum([0] + [g.n for g in groups])
        singles = all(g.n == 1 for g in groups)
        if singles:      # one group of single samples: the batch is their baseline
            kept = [] if self.filter_zero_std and _flat(rewards, live) else list(range(len(groups)))
        else:
            kept = [i for i in range(len(groups)) if not (
                self.filter_zero_std and _flat(rewards[starts[i]:starts[i + 1]], live[starts[i]:starts[i + 1]]))]
        keep = [groups[i] for i in kept]
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in kept] or [np.zeros(0, np.int64)])
        group_index = np.zeros(len(rows), np.int64) if singles else np.repeat(kept, [groups[i].n for i in kept])
        advantages = compute_advantages(rewards[rows], group_index, self.estimator, self.norm_by_std,
                                        EPS, lengths[rows]).astype(np.float32)
        if len(keep) == len(groups):     # nothing filtered: the same columns, no second copy
            batch = replace(consumed, advantages=advantages)
        else:
            batch = concat(keep, kind=BATCH_KIND, ident=step, version=version)
            batch.advantages = advantages
        per_seq = _masked_per_seq(batch)                   # loss-masked tokens per sample
        info = BatchInfo(step=step, version=version, groups=len(groups),
                         trainable=int((per_seq > 0).sum()), trainable_tokens=int(per_seq.sum()),
                         reward_mean=float(rewards.mean()) if rewards.size else 0.0,
                         reward_errors=int(sum(g.scalars[REWARD_ERRORS] for g in groups
                                               if g.scalars.size > REWARD_ERRORS)),
                         consumed=consumed, episode=_episode_fields(groups), parts=groups)
        return batch, info


def _episode_fields(groups: list[Sequences]) -> dict:
    if not groups or any(g.scalars.size < len(SCALARS) for g in groups):
        return {}
    s = np.stack([g.scalars[:len(SCALARS)] for g in groups])
    n = sum(g.n for g in groups)
    return {"turns_mean": float(s[:, TURNS].sum() / n), "turns_max": int(s[:, TURNS_MAX].max()),
            "env_s_mean": float(s[:, ENV_S].sum() / n), "gen_s_mean": float(s[:, GEN_S].sum() / n),
            "tool_calls": int(s[:, TOOL_CALLS].sum()), "episodes_limited": int(s[:, LIMITED].sum()),
            "rollouts_rejected": int(s[:, REJECTED].sum())}
