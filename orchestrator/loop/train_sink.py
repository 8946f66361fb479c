"""Train sink: finished groups -> advantages -> filter -> batch of B groups.

Groups are consumed in completion order. Advantages are GRPO's: (r - group mean) / (group std + eps)
for groups of more than one sample; singleton groups use the batch as their baseline. A sample with
no loss-masked token (a multi-turn episode rejected by the append rule: not trained) takes no part
in a baseline and gets advantage 0; it stays in its group, so its prompt is consumed once. With
`filter_zero_std`, groups whose rewards (of samples with loss-masked tokens) are all equal carry no
signal and are dropped (a singleton batch is dropped only if every such reward in it is equal).
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


def _normalise(r: np.ndarray, live: np.ndarray) -> np.ndarray:
    """GRPO advantages over the samples with loss-masked tokens (`live`); 0 for the others."""
    out = np.zeros(len(r), np.float32)
    if live.any():
        out[live] = (r[live] - r[live].mean()) / (r[live].std() + EPS)
    return out


def _flat(r: np.ndarray, live: np.ndarray) -> bool:
    return not live.any() or np.ptp(r[live]) == 0


def _masked_per_seq(seqs: Sequences) -> np.ndarray:
    cum = np.concatenate(([0], np.cumsum(seqs.loss_mask, dtype=np.int64)))
    return cum[seqs.offsets[1:]] - cum[seqs.offsets[:-1]]


class TrainSink:
    def __init__(self, batch_size: int, filter_zero_std: bool):
        self.batch_size = batch_size
        self.filter_zero_std = filter_zero_std
        self.pending: list[Sequences] = []

    def add(self, group: Sequences) -> None:
        self.pending.append(group)

    def ready(self) -> bool:
        return len(self.pending) >= self.batch_size

    def take_batch(self, step: int, version: int) -> tuple[Sequences, BatchInfo]:
        groups, self.pending = self.pending[:self.batch_size], self.pending[self.batch_size:]
        consumed = concat(groups, kind=BATCH_KIND, ident=step, version=version)
        rewards = consumed.rewards.astype(np.float64)
        live = _masked_per_seq(consumed) > 0
        keep, advs = [], []
        if all(g.n == 1 for g in groups):
            if not (self.filter_zero_std and _flat(rewards, live)):
                keep, advs = groups, [_normalise(rewards, live)]
        else:
            starts = np.cumsum([0] + [g.n for g in groups])
            for g, a in zip(groups, starts):
                r, lv = g.rewards.astype(np.float64), live[a:a + g.n]
                if self.filter_zero_std and _flat(r, lv):
                    continue
                keep.append(g)
                advs.append(_normalise(r, lv) if g.n > 1 else np.zeros(1, np.float32))
        advantages = np.concatenate(advs) if advs else np.zeros(0, np.float32)
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
