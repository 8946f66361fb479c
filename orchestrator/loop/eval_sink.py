"""Eval rounds: when one is due, what it asks for, and what it reports.

`EvalSink(eval_cfg, max_new_tokens, start_step, total_steps, task=None)`: `due(version)` is true
once per version that is a multiple of `eval.every_steps` or is `total_steps` (the final round, as
verl runs one at its last step), after the run's (re)start and while no round is open;
`open_round(step, prompts, new_id)` returns the round's `Generate` requests (every eval prompt,
`eval.samples_per_prompt` samples at `eval.temperature`; `new_id()` allocates request ids) and opens
the round. `add(request_id, group)` collects its rollouts (no advantages, no filtering) and, once
every request of the round has come back, returns one `"kind": "eval"` line: `reward_mean`,
`accuracy` (the fraction of samples with full reward, >= 1), `samples`, `prompts`,
`completion_len_mean`, and for each k of `eval.pass_k`: `pass@k` (the mean over prompts of
`algo.pass_at_k(n, c, k)`, c the prompt's samples at full reward: the chance that one of k samples
is right; pass@1 is `accuracy`) and `mean@k` (the expected mean reward of k samples of a prompt,
averaged over prompts: unbiased from all n samples, so it is the same for every k and equals
`reward_mean` when every prompt has n samples, as verl's mean@N does). Where `task` (the prompt
source) is a mixture (its `eval_source`: eval row -> source name) the line adds `reward_mean/<name>`
per source."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from orchestrator import messages
from orchestrator.algo.pass_at_k import pass_at_k
from shm.codec import Sequences

FULL_REWARD = 1.0


class EvalSink:
    def __init__(self, eval_cfg, max_new_tokens: int, start_step: int = 0,
                 total_steps: Optional[int] = None, task=None):
        self.cfg, self.max_new_tokens, self.total_steps = eval_cfg, max_new_tokens, total_steps
        self.source_of: Optional[Callable[[int], str]] = getattr(task, "eval_source", None)
        self.sources: dict[int, str] = {}            # request id -> its source (a mixture's)
        self.start_step = self.last = start_step     # last: the version of the last round opened
        self.step: Optional[int] = None
        self.expected: set[int] = set()
        self.groups: dict[int, np.ndarray] = {}      # request id -> its rewards (a prompt's samples)
        self.lengths: list[int] = []
        self.prompts = 0

    @property
    def active(self) -> bool:
        return self.step is not None

    def due(self, version: int) -> bool:
        every = self.cfg.every_steps
        return bool(every) and (version % every == 0 or version == self.total_steps) \
            and version > self.start_step and not self.active and self.last < version

    def open_round(self, step: int, prompts, new_id: Callable[[], int]) -> list[messages.Generate]:
        self.last = step
        reqs = [messages.Generate(
            request_id=new_id(), prompt_id=pid, prompt_tokens=np.asarray(tokens).tolist(),
            n=self.cfg.samples_per_prompt, max_new_tokens=self.max_new_tokens,
            temperature=self.cfg.temperature, eval=True, row=row) for pid, tokens, row in prompts]
        if reqs:
            self.step, self.expected, self.groups, self.lengths = step, {m.request_id for m in reqs}, {}, []
            self.prompts = len(reqs)
            if self.source_of is not None:
                self.sources = {m.request_id: self.source_of(m.row) for m in reqs}
        return reqs

    def add(self, request_id: int, group: Sequences) -> Optional[dict]:
        """Add one finished eval group; returns the summary when the round is complete."""
        if request_id not in self.expected:
            return None
        self.expected.discard(request_id)
        self.groups[request_id] = np.asarray(group.rewards, dtype=np.float64)
        self.lengths.extend(int(group.loss_mask[group.seq(i)].sum()) for i in range(group.n))
        if self.expected:
            return None
        groups = list(self.groups.values())
        rewards = np.concatenate(groups)
        out = {"kind": "eval", "step": self.step, "reward_mean": float(rewards.mean()),
               "accuracy": float((rewards >= FULL_REWARD).mean()), "samples": len(rewards),
               "prompts": self.prompts, "completion_len_mean": float(np.mean(self.lengths))}
        for k in self.cfg.pass_k:
            out[f"pass@{k}"] = float(np.mean([pass_at_k(len(g), int((g >= FULL_REWARD).sum()), k)
                                              for g in groups]))
            out[f"mean@{k}"] = float(np.mean([g.mean() for g in groups]))
        if self.source_of is not None:
            from orchestrator.data.mixture import source_means
            out.update(source_means([self.sources[r] for r in self.groups], groups))
        self.step = None
        return out
