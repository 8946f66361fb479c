"""What a trained step reports: the fields of its `kind: step` line, and the checks made on them.

- `step_fields(info, done) -> (fields, ages)`: the fields a step line takes from its batch
  (`BatchInfo`: versions, rewards, episodes) and the trainer's `StepDone` (loss, stats, time):
  the observed head age over live loss-masked tokens (`age_max`, `age_p99`, `age_mean`), per-token
  ages, head/tail spans, and the trainer's stats (`logprob_diff_*` and, with actor.kl_ctl,
  `kl_ref_mean` promoted, the rest as `train_<name>`). `ages` is the head-age summary the metrics
  ticks repeat.
- `check_mismatch(step, stats, limit)`: fail the run (exit 1) when the trainer's
  `logprob_diff_mean` exceeds `actor.logprob_diff_limit`.
- `check_resume_bound(admitted, S, B)`: the first step after a resume admitted at most (S+1)*B
  prompts, or the run fails loudly (the recovery adjustment was lost).
- `StepLines(cfg, metrics, start_step, resumed)`: the event loop's step-line book. `shipped(step,
  info, parked_s)` when a batch goes to the trainer, `done(msg) -> BatchInfo` at its StepDone,
  `flush(version, extra)` writes, in step order, the line of every step whose StepDone has arrived
  and whose weights every inference worker has loaded (`version` >= step; the two come in either
  order), with the fields `extra()` returns at that moment. `admitted` / `filtered` count the
  admissions and dynamic-sampling drops since the last line, `written` is the last step whose
  line is written (checkpoints commit only up to it), `last_ages` / `last_parked_s` what the
  metrics ticks repeat.
"""
from __future__ import annotations

from typing import Callable, Optional

from orchestrator import messages
from orchestrator.algo.stamp import age_parts, age_summary, sequence_stamps, token_ages
from orchestrator.errors import RunFailed
from orchestrator.loop.train_sink import BatchInfo
from orchestrator.observe.metrics import MetricsLog

MISMATCH = ("logprob_diff_mean", "logprob_diff_max")    # trainer stats promoted to the step line
KL_REF = "kl_ref_mean"          # actor.kl_ctl: the KL to the reference, by the name (#24)


def check_mismatch(step: int, stats: dict, limit) -> None:
    """Fail the run (exit 1) when the trainer's logprob_diff_mean exceeds actor.logprob_diff_limit."""
    diff = stats.get("logprob_diff_mean")
    if limit is None or diff is None or diff <= limit:
        return
    raise RunFailed(
        f"step {step}: inference and trainer logprobs differ by {diff:.3g} on average (max "
        f"{stats.get('logprob_diff_max', diff):.3g}) over {int(stats.get('logprob_diff_tokens', 0))} "
        f"tokens sampled by the weights the trainer holds, above actor.logprob_diff_limit={limit:g}: "
        f"inference is not sampling from the trained weights (weight load, dtype or kernels)", 1)


def check_resume_bound(admitted: int, max_staleness: int, batch_size: int) -> None:
    bound = (max_staleness + 1) * batch_size
    if admitted > bound:
        raise RunFailed(f"resume lost the staleness bound: {admitted} admissions "
                        f"before the first step, more than (S+1)*B={bound}")


def step_fields(info: BatchInfo, done: messages.StepDone) -> tuple[dict, dict]:
    c = info.consumed
    heads, tails, live = sequence_stamps(c.offsets, c.versions, c.loss_mask)
    ages = age_summary(info.version - heads[live])
    tokens = age_summary(token_ages(info.version, c.versions, c.loss_mask))
    fields = dict(
        step=done.step, version=info.version, **ages,
        token_age_p99=tokens["age_p99"], token_age_mean=tokens["age_mean"],
        trainable=info.trainable, trainable_tokens=info.trainable_tokens,
        reward_mean=info.reward_mean, reward_errors=info.reward_errors,
        loss=done.stats.get("loss"), **{k: done.stats.get(k) for k in MISMATCH},
        train_s=done.train_s, groups=info.groups,
        spanning=int((live & (heads != tails)).sum()), not_live=int((~live).sum()),
        **age_parts(info.version, heads[live], tails[live]),
        **info.episode,
        **({KL_REF: done.stats[KL_REF]} if KL_REF in done.stats else {}),
        **{f"train_{k}": v for k, v in done.stats.items()
           if k != "loss" and k != KL_REF and k not in MISMATCH})
    return fields, ages


class StepLines:
    def __init__(self, cfg, metrics: MetricsLog, start_step: int, resumed: bool):
        self.cfg, self.metrics, self.resumed, self.start_step = cfg, metrics, resumed, start_step
        self.pending: dict[int, tuple[BatchInfo, Optional[messages.StepDone], float]] = {}
        self.admitted = 0                  # admissions since the last line
        self.filtered = 0                  # groups dynamic sampling kept out since the last line
        self.written = start_step          # last step whose step line is written
        self.last_ages: dict = {}
        self.last_parked_s: Optional[float] = None

    def shipped(self, step: int, info: BatchInfo, parked_s: float) -> None:
        self.pending[step] = (info, None, parked_s)

    def done(self, msg: messages.StepDone) -> BatchInfo:
        info, _, parked = self.pending[msg.step]
        self.pending[msg.step] = (info, msg, parked)
        return info

    def flush(self, version: int, extra: Callable[[], dict]) -> None:
        while self.pending:
            step = min(self.pending)
            info, done, parked = self.pending[step]
            if done is None or version < step:
                return
            del self.pending[step]
            self._write(info, done, parked, extra())

    def _write(self, info: BatchInfo, done: messages.StepDone, parked: float, extra: dict) -> None:
        fields, ages = step_fields(info, done)
        first_after_resume = self.resumed and done.step == self.start_step + 1
        r = self.cfg.rollout
        if first_after_resume:      # a filtered group frees its slot: it does not count against S
            check_resume_bound(self.admitted - self.filtered, r.max_head_offpolicyness,
                               r.consumer_batch_size)
        if r.dynamic_sampling:
            fields["filtered"] = self.filtered
        self.metrics.write("step", **fields, admitted=self.admitted, resumed=first_after_resume,
                           parked_s=parked, **extra)
        self.admitted = self.filtered = 0
        self.written = done.step
        check_mismatch(done.step, done.stats, self.cfg.actor.logprob_diff_limit)
        self.last_ages = {k: v for k, v in ages.items() if k != "age_mean"}
        self.last_parked_s = parked
