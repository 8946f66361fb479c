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
rollouts rejected by the append rule, and `branches`: the sequences beyond one per episode (an agent
episode's other branches, `envs.agent_session`: each trained with its episode's reward, a sample of
its group's baseline like any other; a group of one episode and its branches counts as a single
sample's group for the batch baseline).

Overlong handling (DAPO; `algo.overlong_*`, single-turn; `orchestrator.algo.overlong`), applied
before the zero-std filter and the advantages, on the completion length (tokens after the prompt):
with `overlong_filter`, completions cut at rollout.max_new_tokens (that length, last token not a
stop id) lose their loss-masked tokens in the batch (not trained, out of their group's baseline);
with `overlong_buffer_len`, the soft punishment is added to each sample's reward for the advantages
(the batch keeps the task's rewards, `reward_mean` too). The step line then carries
`overlong_cut` (completions that reached the limit without a stop token), `overlong_filtered`,
`overlong_penalized` (samples with a penalty) and `overlong_penalty_mean` (over the batch), as far
as each is configured. `TrainSink.for_config(cfg)` builds the sink of a run.

Dynamic sampling (DAPO; `rollout.dynamic_sampling`): `add(group)` returns False for a group whose
task rewards (of samples with loss-masked tokens) are all equal: it never enters a batch, the loop
frees its gate slot (`on_dropped`) so a new prompt fills the batch, and it rides with the next batch
built (`BatchInfo.filtered`; the step line's `filtered_groups` and `filtered_prompts`), so that its
prompt counts as consumed exactly when that batch's step does. `rollout.max_consecutive_filtered`
groups filtered in a row raise `EmptyBatches` (the run ends, exit 1, naming the keys).
"""
from __future__ import annotations


from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from orchestrator.algo import compute_advantages, cut_at_limit, overlong_penalty
from orchestrator.data.reward_pool import REWARD_ERRORS
from orchestrator.errors import EmptyBatches
from orchestrator.envs.base import (BRANCHES, ENV_S, GEN_S, LIMITED, REJECTED, SCALARS, TOOL_CALLS,
                                    TURNS, TURNS_MAX)
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
    episode: dict            # the batch's own step-line fields: multi-turn episodes, overlong counts
    parts: list              # the groups themselves, in completion order
    filtered: list = field(default_factory=list)   # groups dynamic sampling kept out since the last batch


def _flat(r: np.ndarray, live: np.ndarray) -> bool:
    return not live.any() or np.ptp(r[live]) == 0


def _masked_per_seq(seqs: Sequences) -> np.ndarray:
    cum = np.concatenate(([0], np.cumsum(seqs.loss_mask, dtype=np.int64)))
    return cum[seqs.offsets[1:]] - cum[seqs.offsets[:-1]]


@dataclass(frozen=True)
class Overlong:
    """DAPO's overlong handling of a run: the limit, the stop ids that end a completion on its own,
    the filter, and the soft punishment's buffer (None: off) and factor."""
    max_len: int
    stop_ids: tuple[int, ...] = ()
    filter: bool = False
    buffer_len: Optional[int] = None
    factor: float = 1.0

    def apply(self, seqs: Sequences, rewards: np.ndarray) -> tuple[Sequences, np.ndarray, dict]:
        """(seqs with cut completions' loss mask cleared if filtering, rewards shaped for the
        advantages, step-line counts)."""
        offsets = np.asarray(seqs.offsets, dtype=np.int64)
        lengths = np.maximum(np.diff(offsets) - np.asarray(seqs.prompt_lens, dtype=np.int64), 0)
        last = np.asarray(seqs.tokens)[np.maximum(offsets[1:] - 1, 0)] if seqs.n else np.zeros(0)
        cut = cut_at_limit(lengths, last, self.max_len, self.stop_ids)
        fields: dict = {"overlong_cut": int(cut.sum())}
        if self.filter:
            drop = np.repeat(cut, np.diff(offsets))
            mask = np.asarray(seqs.loss_mask).copy()     # the consumed groups keep theirs (ages)
            fields["overlong_filtered"] = int((cut & (_masked_per_seq(seqs) > 0)).sum())
            mask[drop] = 0
            seqs = replace(seqs, loss_mask=mask)
        if self.buffer_len is not None:
            penalty = overlong_penalty(lengths, self.max_len, self.buffer_len, self.factor)
            rewards = rewards + penalty
            fields["overlong_penalized"] = int((penalty < 0).sum())
            fields["overlong_penalty_mean"] = float(penalty.mean()) if penalty.size else 0.0
        return seqs, rewards, fields

    @classmethod
    def for_config(cls, cfg) -> Optional["Overlong"]:
        algo = cfg.algo
        if not algo.overlong_filter and algo.overlong_buffer_len is None:
            return None
        stop_ids: tuple[int, ...] = ()
        if algo.overlong_filter:          # what ends a completion on its own: the model's stop ids
            from orchestrator.data.tokens import load_tokens
            stop_ids = load_tokens(cfg.model.path).stop_ids
        return cls(cfg.rollout.max_new_tokens, stop_ids, algo.overlong_filter,
                   algo.overlong_buffer_len, algo.overlong_penalty_factor)


class TrainSink:
    def __init__(self, batch_size: int, filter_zero_std: bool,
                 estimator: str = "grpo_population_std", norm_by_std: bool = True,
                 overlong: Optional[Overlong] = None, dynamic_sampling: bool = False,
                 max_consecutive_filtered: int = 1000):
        self.batch_size = batch_size
        self.dynamic_sampling, self.max_consecutive_filtered = dynamic_sampling, max_consecutive_filtered
        self.filtered: list[Sequences] = []     # kept out by dynamic sampling, not yet in a batch
        self.filtered_in_a_row = 0
        self.filter_zero_std = filter_zero_std
        self.estimator, self.norm_by_std = estimator, norm_by_std
        self.overlong = overlong
        self.pending: list[Sequences] = []

    @classmethod
    def for_config(cls, cfg) -> "TrainSink":
        """The train sink of run config `cfg` (rollout and algo sections)."""
        r, a = cfg.rollout, cfg.algo
        return cls(r.consumer_batch_size, r.filter_zero_std, a.advantage, a.norm_by_std,
                   Overlong.for_config(cfg), r.dynamic_sampling, r.max_consecutive_filtered)

    def add(self, group: Sequences) -> bool:
        """Queue a finished group for a batch; False: dynamic sampling kept it out (see above)."""
        if self.dynamic_sampling and _flat(group.rewards.astype(np.float64), _masked_per_seq(group) > 0):
            self.filtered.append(group)
            self.filtered_in_a_row += 1
            if self.filtered_in_a_row >= self.max_consecutive_filtered:
                raise EmptyBatches(
                    f"{self.filtered_in_a_row} groups in a row had equal rewards and were filtered "
                    f"(rollout.dynamic_sampling, rollout.max_consecutive_filtered="
                    f"{self.max_consecutive_filtered}): check the task's reward function / environment, "
                    f"or the policy stopped exploring (every sample of a prompt alike)", 1)
            return False
        self.filtered_in_a_row = 0
        self.pending.append(group)
        return True

    def ready(self) -> bool:
        return len(self.pending) >= self.batch_size

    def take_batch(self, step: int, version: int) -> tuple[Sequences, BatchInfo]:
        groups, self.pending = self.pending[:self.batch_size], self.pending[self.batch_size:]
        consumed = concat(groups, kind=BATCH_KIND, ident=step, version=version)
        rewards = consumed.rewards.astype(np.float64)
        shaped, trained, shaping = rewards, consumed, {}
        if self.overlong is not None:
            trained, shaped, shaping = self.overlong.apply(consumed, rewards)
        lengths = _masked_per_seq(trained)
        live = lengths > 0
        starts = np.cumsum([0] + [g.n for g in groups])
        singles = all(_episodes(g) == 1 for g in groups)
        if singles:      # one group of single samples: the batch is their baseline
            kept = [] if self.filter_zero_std and _flat(shaped, live) else list(range(len(groups)))
        else:
            kept = [i for i in range(len(groups)) if not (
                self.filter_zero_std and _flat(shaped[starts[i]:starts[i + 1]], live[starts[i]:starts[i + 1]]))]
        keep = [groups[i] for i in kept]
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in kept] or [np.zeros(0, np.int64)])
        group_index = np.zeros(len(rows), np.int64) if singles else np.repeat(kept, [groups[i].n for i in kept])
        advantages = compute_advantages(shaped[rows], group_index, self.estimator, self.norm_by_std,
                                        EPS, lengths[rows]).astype(np.float32)
        if len(keep) == len(groups):     # nothing filtered: the same columns, no second copy
            batch = replace(trained, advantages=advantages)
        else:
            batch = concat(keep, kind=BATCH_KIND, ident=step, version=version)
            if trained is not consumed:   # the overlong filter's mask, on the kept rows
                batch.loss_mask = trained.loss_mask[np.concatenate(
                    [np.arange(consumed.offsets[r], consumed.offsets[r + 1]) for r in rows]
                    or [np.zeros(0, np.int64)])]
            batch.advantages = advantages
        per_seq = _masked_per_seq(batch)                   # loss-masked tokens per sample
        info = BatchInfo(step=step, version=version, groups=len(groups),
                         trainable=int((per_seq > 0).sum()), trainable_tokens=int(per_seq.sum()),
                         reward_mean=float(rewards.mean()) if rewards.size else 0.0,
                         reward_errors=int(sum(g.scalars[REWARD_ERRORS] for g in groups
                                               if g.scalars.size > REWARD_ERRORS)),
                         consumed=consumed, episode={**_episode_fields(groups), **shaping},
                         parts=groups, filtered=self.filtered)
        if self.dynamic_sampling:
            info.episode.update(filtered_groups=len(self.filtered),
                                filtered_prompts=[int(g.prompt_ids[0]) for g in self.filtered])
        self.filtered = []
        return batch, info


def _episodes(g: Sequences) -> int:
    """The group's episodes: its sequences less an agent episode's extra branches."""
    return g.n - (int(g.scalars[BRANCHES]) if g.scalars.size > BRANCHES else 0)


def _episode_fields(groups: list[Sequences]) -> dict:
    if not groups or any(g.scalars.size < len(SCALARS) for g in groups):
        return {}
    s = np.stack([g.scalars[:len(SCALARS)] for g in groups])
    n = sum(_episodes(g) for g in groups)
    return {"turns_mean": float(s[:, TURNS].sum() / n), "turns_max": int(s[:, TURNS_MAX].max()),
            "env_s_mean": float(s[:, ENV_S].sum() / n), "gen_s_mean": float(s[:, GEN_S].sum() / n),
            "tool_calls": int(s[:, TOOL_CALLS].sum()), "episodes_limited": int(s[:, LIMITED].sum()),
            "rollouts_rejected": int(s[:, REJECTED].sum()), "branches": int(s[:, BRANCHES].sum())}
