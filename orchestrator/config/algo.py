"""`algo:` the recipe: advantage estimator, policy loss, aggregation, KL, rollout correction."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from orchestrator.config.base import MAX_TOKENS, _Section


class AlgoConfig(_Section):
    """Training recipe choices (orchestrator.algo); the names are verl's. Clip ranges, dual clip and
    the behaviour-weight cap keep AReaL's `actor.*` keys (eps_clip, eps_clip_higher, c_clip,
    behav_imp_weight_cap). Defaults are the original recipe: GRPO advantages with the population std,
    the token-mean of the (decoupled) PPO loss."""
    advantage: Literal["grpo", "grpo_population_std", "dr_grpo", "rloo", "reinforce_pp_baseline"] = Field(
        "grpo_population_std", description="advantage estimator (orchestrator.algo.advantages): "
        "grpo (group mean baseline / unbiased group std, as verl and TRL), grpo_population_std (the "
        "same with the population std: this project's original, the default), dr_grpo (no std "
        "division), rloo (leave-one-out mean of the group's other samples), reinforce_pp_baseline "
        "(group mean subtracted, then whitened over the batch's loss-masked tokens)")
    norm_by_std: bool = Field(True, description="grpo / grpo_population_std: divide by the group's "
                              "std (false: Dr. GRPO's unscaled advantage); the other estimators "
                              "do not read it")
    policy_loss: Literal["ppo", "gspo", "cispo"] = Field(
        "ppo", description="policy loss (orchestrator.algo.policy): ppo (clipped ratio, "
        "actor.eps_clip / actor.eps_clip_higher, dual clip actor.c_clip), gspo (sequence-level "
        "length-normalised ratio, token-level gradient; GSPO uses clip ranges near 3e-4 / 4e-4), "
        "cispo (clipped importance weight as a constant times the logprob, MiniMax-M1)")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                           "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="how per-token losses become the batch loss (verl's names): "
        "token-mean (over the batch's loss-masked tokens), seq-mean-token-mean (each sequence's "
        "token mean, averaged over sequences), seq-mean-token-sum, seq-mean-token-sum-norm "
        "(seq-mean-token-sum / algo.loss_horizon, Dr. GRPO); the same whatever the ranks and "
        "micro-batches; the entropy bonus is aggregated the same way")
    loss_horizon: Optional[int] = Field(
        None, ge=1, le=MAX_TOKENS, description="seq-mean-token-sum-norm: the constant divisor "
        "(Dr. GRPO: the longest completion; None: rollout.max_new_tokens); other modes refuse it")
    rollout_correction: Literal["none", "tis", "mis"] = Field(
        "none", description="train/inference mismatch correction with w = exp(recomputed - "
        "behaviour logprob), needs actor.recompute_logprob and actor.use_decoupled_loss=false (the "
        "decoupled loss already weights by w, capped): tis multiplies each token's loss by min(w, "
        "algo.correction_threshold); mis drops tokens (or sequences) whose w lies outside "
        "[algo.correction_threshold_low, algo.correction_threshold] (weight 0, still counted in "
        "the loss's denominator) and weights the others by w")
    correction_level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="what w is: token (each token's ratio), sequence (the product of the "
        "sequence's token ratios), geometric (their length-normalised geometric mean)")
    correction_threshold: float = Field(2.0, gt=0, description="tis: the truncation C; mis: the "
                                        "upper bound of the kept band")
    correction_threshold_low: Optional[float] = Field(
        None, ge=0, description="mis only: the lower bound of the kept band (None: 0, drop above "
        "only; 1/correction_threshold: a two-sided mask)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="per-token KL of actor.kl_ctl (orchestrator.algo.kl): k1 (log-ratio), k2 "
        "(half its square), k3 (exp(-d) - 1 + d, clamped to [-10, 10]: verl's low_var_kl, the "
        "GRPO paper's estimator)")
    overlong_filter: bool = Field(
        False, description="DAPO's overlong filtering: completions the engine cut at "
        "rollout.max_new_tokens (that length, not ending in a stop token) get no loss-masked token: "
        "not trained, out of their group's baseline (advantage 0), their prompt still consumed; "
        "counted as overlong_filtered in the step line (single-turn tasks)")
    overlong_buffer_len: Optional[int] = Field(
        None, ge=1, le=MAX_TOKENS, description="DAPO's soft overlong punishment: completions longer "
        "than rollout.max_new_tokens - this get a reward penalty falling linearly from 0 to "
        "-algo.overlong_penalty_factor at rollout.max_new_tokens, added before the advantages "
        "(step line: overlong_penalty_mean, overlong_penalized); at most rollout.max_new_tokens "
        "(DAPO: 4096 of 20480); None: off (single-turn tasks)")
    overlong_penalty_factor: float = Field(
        1.0, gt=0, le=1e6, description="the soft punishment's largest penalty (verl's "
        "penalty_factor; DAPO: 1.0); needs algo.overlong_buffer_len")
