"""`rollout:` what is generated per step and the staleness gate's knobs; `eval:` held-out rounds."""
from __future__ import annotations

from typing import Optional

from pydantic import Field, model_validator

from orchestrator.config.base import MAX_STEPS, MAX_TOKENS, MAX_COUNT, _Section


class RolloutConfig(_Section):
    max_head_offpolicyness: int = Field(2, ge=0, le=MAX_STEPS, description="S: max versions between "
                                        "the oldest token and the trainer (<= 99,999,999, the bound of "
                                        "run.total_steps: beyond it the gate never binds)")
    max_observed_offpolicyness: Optional[int] = Field(
        None, ge=0, le=MAX_STEPS, description="hard bound (>= max_head_offpolicyness) on the head age "
        "of every trained token, on top of the gate: a rollout in flight that can no longer meet it is aborted and its prompt "
        "re-admitted (a rejection), a finished one that would be trained older is dropped and "
        "re-admitted; the step lines count both and the tokens wasted (None: off)")
    consumer_batch_size: int = Field(8, ge=1, le=65536, description="B: rollouts (prompt groups) per "
                                     "training batch (<= 65536; preflight sizes the batch ring from it)")
    max_concurrent_rollouts: Optional[int] = Field(None, ge=1, le=MAX_COUNT, description="C: in-flight "
                                                   "cap; None: consumer_batch_size (<= 1M: held in memory)")
    queue_size: int = Field(1024, ge=1, le=MAX_COUNT, description="dispatcher input/output queue size "
                            "(<= 1M: the queues live in the supervisor's memory)")
    group_size: int = Field(1, ge=1, le=65536, description="samples per prompt (GRPO group; <= 65536)")
    max_new_tokens: int = Field(16, ge=1, le=MAX_TOKENS, description="completion length limit (<= 1M "
                                "tokens; the rings are sized from it)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    filter_zero_std: bool = Field(True, description="drop groups whose rewards are all equal (no learning signal)")
    dynamic_sampling: bool = Field(False, description="DAPO's dynamic sampling: a group whose rewards "
                                   "are all equal is not trained; its gate slot goes to a new prompt, so "
                                   "every batch holds B groups that differ (its prompt counts as consumed; "
                                   "filter_zero_std then has nothing left to drop)")
    max_consecutive_filtered: int = Field(1000, ge=1, le=10_000_000, description="with dynamic_sampling: "
                                          "this many groups filtered in a row end the run (exit 1, like "
                                          "run.empty_batch_limit) instead of sampling forever")

    @property
    def concurrency(self) -> int:
        return self.max_concurrent_rollouts or self.consumer_batch_size

    @model_validator(mode="after")
    def _bound_above_gate(self) -> "RolloutConfig":
        m, s = self.max_observed_offpolicyness, self.max_head_offpolicyness
        if m is not None and m < s:
            raise ValueError(f"max_observed_offpolicyness={m} is below max_head_offpolicyness={s}: "
                             f"the gate admits rollouts S versions ahead by design, so most would be "
                             f"aborted; lower S instead (the hard bound caps the tail above S)")
        if self.dynamic_sampling and self.group_size < 2:
            raise ValueError(f"rollout.dynamic_sampling with rollout.group_size={self.group_size}: a "
                             f"group of one always has equal rewards, so every group would be filtered")
        return self


class EvalConfig(_Section):
    every_steps: int = Field(0, ge=0, le=MAX_STEPS, description="run the eval set every N steps (0: off)")
    temperature: float = Field(1.0, gt=0, description="eval sampling temperature")
    samples_per_prompt: int = Field(1, ge=1, le=65536, description="eval samples per prompt (<= 65536)")
    pass_k: list[int] = Field(default_factory=list, description="eval lines carry pass@k (the "
                              "unbiased estimator of Chen et al. 2021; a sample is correct at full "
                              "reward) and mean@k for each k here, each 1 <= k <= "
                              "eval.samples_per_prompt (e.g. [1, 8] with samples_per_prompt 8)")

    @model_validator(mode="after")
    def _pass_k_fits(self) -> "EvalConfig":
        bad = [k for k in self.pass_k if not 1 <= k <= self.samples_per_prompt]
        if bad:
            raise ValueError(f"eval.pass_k {bad} outside 1..eval.samples_per_prompt="
                             f"{self.samples_per_prompt}: pass@k needs k samples of each prompt")
        if len(set(self.pass_k)) != len(self.pass_k):
            raise ValueError(f"eval.pass_k {self.pass_k} repeats a k")
        return self
