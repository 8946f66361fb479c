"""`actor:` the trainer: backend, devices and ranks, optimizer, PPO knobs, LoRA (`actor.lora`),
and the helpers that resolve its defaults (logprob_diff_default, trainer_layout)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import Field, PositiveFloat, field_validator, model_validator

from orchestrator.config.base import (MAX_TIMEOUT_S, MAX_THREADS, MAX_TOKENS, _DEVICE, _Section,
                                      _device_text, DeviceList)


class SimTrainerConfig(_Section):
    step_time_s: float = Field(0.02, ge=0, le=3600.0, description="fixed time per trainer step (<= 1 h)")
    save_time_s: float = Field(0.0, ge=0, le=3600.0, description="time writing a checkpoint takes "
                               "(in the background; <= 1 h)")
    weight_bytes: int = Field(1 << 16, ge=8, le=1 << 40, description="size of the fake weight buffer "
                              "published per step (<= 1 TiB; preflight checks it fits /dev/shm twice)")


# the linear layers of the built-in tiny Llama (model.path None): the names actor.lora.target_modules
# may give it (a model.path directory's own are checked by preflight from its weight files)
TINY_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def default_lora_alpha(hidden_size: int) -> float:
    """actor.lora.alpha's default for a model of `hidden_size`: sqrt(hidden_size) (8 at the built-in
    model's 64, 64 at 4096). A LoRA step's size against a full step's at one rate shrinks as the
    model widens (scripts/bench_lora_scale.py), so an alpha the field tunes at 2k-8k widths makes a
    narrow model's LoRA steps as large as full fine-tuning's: 10x the rate broke it (issue #39).
    Measured best of 4 / 6 / 8 at width 64 (README "LoRA"), not derived."""
    return math.sqrt(hidden_size)


class LoraConfig(_Section):
    """LoRA adapters trained instead of the full model (peft; issue #25)."""
    rank: int = Field(..., ge=1, le=65536, description="adapter rank r (the inner size of B x A; "
                      ">= 1, <= 65536: past any layer's width)")
    alpha: Optional[float] = Field(None, gt=0, le=1e6, description="LoRA alpha: the update is "
                                   "(alpha / rank) x B x A (None: sqrt(hidden_size) of the model, "
                                   "8 for the built-in one; see README LoRA)")
    lr_scale: float = Field(10.0, gt=0, le=1e4, description="B trains at actor.lr x lr_scale "
                            "(the field's LoRA rule: about 10x full fine-tuning's rate, so one "
                            "actor.lr serves both; 1: actor.lr itself)")
    loraplus_lr_ratio: float = Field(16.0, ge=1, le=1e4, description="LoRA+ (Hayou et al. 2024; "
                                     "peft's loraplus_lr_ratio): A trains at B's rate / this; 1: "
                                     "one rate for both")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input in "
                           "training (the published merged weights have none)")
    target_modules: Union[Literal["all-linear"], list[str]] = Field(
        "all-linear", description="leaf names of the layers given adapters (e.g. [q_proj, v_proj]) "
        "or all-linear (peft: every linear layer but the output head); names the model does not "
        "have are refused")

    @field_validator("target_modules", mode="before")
    @classmethod
    def _some_names(cls, v):
        if v == "all-linear":
            return v
        if not isinstance(v, list) or not v or not all(isinstance(n, str) and n.strip() for n in v):
            raise ValueError("must be all-linear or a non-empty list of layer names (e.g. "
                             "[q_proj, v_proj])")
        return v

    def resolved_alpha(self, hidden_size: int) -> float:
        """alpha, or its default for a model of `hidden_size` (`default_lora_alpha`)."""
        return float(self.alpha) if self.alpha is not None else default_lora_alpha(hidden_size)


class ActorConfig(_Section):
    backend: Literal["sim", "torch"] = Field("sim", description="trainer backend")
    device: str = Field("cpu", description="trainer device: 'cpu' or a CUDA index disjoint from "
                        "inference (one rank; several: actor.devices)")
    devices: DeviceList = Field(default_factory=list, description="one trainer rank per CUDA device "
                               "(e.g. ['4','5','6','7']), disjoint from inference.devices; empty: "
                               "actor.device, or actor.num_ranks ranks on CPU")
    colocate: bool = Field(False, description="let the trainer's device be one of inference.devices "
                           "(one GPU for both, e.g. a single-GPU machine; they share its memory and "
                           "weights still go over CUDA IPC); false: the devices must be disjoint")
    num_ranks: int = Field(1, ge=1, le=64, description="trainer ranks on CPU (gloo; <= 64); with "
                           "actor.devices it is len(actor.devices) (1 or that number may be given)")
    sharding: Literal["auto", "none", "fsdp", "ddp"] = Field(
        "auto", description="how ranks share the model: fsdp (FSDP2 fully_shard: parameters, "
        "gradients and optimizer state sharded), ddp (replicated), none (one rank only); auto: "
        "none for one rank, fsdp for more")
    micro_batch_tokens: Optional[int] = Field(
        None, ge=1, le=MAX_TOKENS, description="padded tokens (sequences x longest) per forward "
        "pass, with gradient accumulation; the loss is the same per-token mean over the whole "
        "batch whatever the split (None: each rank's share in one pass)")
    pack_sequences: bool = Field(
        False, description="padding-free micro-batches: sequences end to end in one row, position "
        "ids restarting per sequence (sdpa / flash attention keep them apart; checked against the "
        "padded forward when the trainer starts, and refused where they differ)")
    param_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        None, description="fsdp: dtype parameters are gathered and computed in (None: model.dtype)")
    reduce_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        "float32", description="fsdp: dtype gradients are reduced in (None: the compute dtype)")
    activation_checkpointing: bool = Field(False, description="recompute each decoder layer's "
                                           "activations in backward (less memory, ~1/3 more compute)")
    collective_timeout_s: float = Field(
        300.0, gt=0, le=MAX_TIMEOUT_S, description="ranks: a collective that waits longer on a "
        "peer fails the rank (the heartbeat deadline usually fires first) (<= 1 day)")
    threads: int = Field(1, ge=1, le=MAX_THREADS,
                         description="torch intra-op threads per trainer rank on CPU (<= 1024 cores)")
    lr: float = Field(1e-3, gt=0, description="learning rate (Adam)")
    eps_clip: float = Field(0.2, gt=0, description="PPO clip range (the lower one with actor.eps_clip_higher)")
    eps_clip_higher: Optional[float] = Field(
        None, gt=0, description="upper clip range (DAPO's clip-higher, e.g. 0.28): the ratio is "
        "clipped to [1 - eps_clip, 1 + eps_clip_higher] (AReaL's name); None: eps_clip")
    c_clip: Optional[float] = Field(
        None, gt=1, description="dual-clip PPO (Ye et al. 2020): a token with negative advantage "
        "loses at most -A x c_clip however far its ratio is (AReaL's name; > 1; None: off; "
        "algo.policy_loss=ppo only)")
    kl_ctl: float = Field(
        0.0, ge=0, le=1e6, description="KL-to-reference coefficient (AReaL's name): > 0 loads a "
        "frozen reference model (actor.ref_path, or the initial weights), sharded like the actor, "
        "forward only, and adds kl_ctl x the per-token KL (algo.kl_estimator) aggregated by "
        "algo.loss_agg_mode to the loss; step lines: kl_ref_mean (the batch's token-mean KL "
        "before the update) and train_kl_ref_loss; checkpoints hold its hash, not its weights "
        "(0: off)")
    ref_path: Optional[str] = Field(
        None, description="the reference model of actor.kl_ctl: an HF model directory (a "
        "checkpoint's trainer/hf/ too); None: the run's initial weights (model.path, or the tiny "
        "model of run.seed)")
    ref_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        None, description="dtype the reference model is held and run in (None: model.dtype)")
    use_decoupled_loss: bool = Field(True, description="decoupled PPO objective (proximal policy = recomputed logprobs)")
    recompute_logprob: bool = Field(True, description="recompute logprobs under the current policy before the update")
    behav_imp_weight_cap: Optional[float] = Field(5.0, gt=1, description="cap on the behaviour importance weight (decoupled loss)")
    ppo_epochs: int = Field(1, ge=1, le=1000, description="optimizer passes over each batch (<= 1000: "
                            "more only overfits one batch)")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus on loss-masked tokens (0: off)")
    logprob_diff_limit: Union[Literal["auto"], PositiveFloat, None] = Field(
        "auto", description="fail the run when a step's logprob_diff_mean (mean |trainer - "
        "inference| logprob over tokens sampled by the weights the trainer recomputed with; needs "
        "recompute_logprob) exceeds this: inference is not sampling from the trained weights. "
        "auto: a bound a correct engine never reaches in its dtype (`logprob_diff_default`: 1e-3 "
        "when trainer and inference compute in float32, 0.1 otherwise); None: reported only")
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description="learning-rate schedule over run.total_steps")
    lr_min_ratio: float = Field(0.1, ge=0, le=1, description="cosine: final lr as a fraction of actor.lr")
    lr_warmup_steps: int = Field(
        0, ge=0, description="linear warm-up over the first N trainer steps (lr * step / N; verl's "
        "name), then actor.lr_schedule over the steps left; 0: none")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    heartbeat_timeout_s: float = Field(
        600.0, gt=0, le=MAX_TIMEOUT_S,
        description="progress deadline of the trainer: no main-loop turn for this long "
                    "(a step, a save or a load that never ends; SIGSTOP) fails the run (<= 1 day)")
    liveness_timeout_s: float = Field(
        30.0, ge=2, le=MAX_TIMEOUT_S,
        description="liveness deadline of the trainer and of every trainer rank: a process whose "
                    "liveness thread stamps nothing for this long (stopped or frozen, e.g. SIGSTOP) "
                    "fails the run naming it, however long a step may legitimately take "
                    "(actor.heartbeat_timeout_s) (2 s .. 1 day)")
    lora: Optional[LoraConfig] = Field(
        None, description="train LoRA adapters (peft) instead of every weight: {rank, alpha, "
        "lr_scale, loraplus_lr_ratio, dropout, target_modules}; only the adapters take gradients and optimizer state, "
        "inference gets base + B x A merged in the usual weight layout, checkpoints hold the "
        "adapters, their optimizer state and the base model's hash (None: full fine-tuning)")
    sim: SimTrainerConfig = Field(default_factory=SimTrainerConfig)

    @field_validator("device", mode="before")
    @classmethod
    def _device_as_text(cls, v: Any) -> Any:
        return _device_text(v)

    @field_validator("device")
    @classmethod
    def _device_is_cpu_or_index(cls, v: str) -> str:
        if v != "cpu" and not _DEVICE.match(v):
            raise ValueError(f"{v!r} is neither 'cpu' nor a CUDA device index (such as '0')")
        return v

    @field_validator("devices")
    @classmethod
    def _one_rank_per_device(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            twice = next(d for d in v if v.count(d) > 1)
            raise ValueError(f"device {twice!r} is listed twice (one trainer rank per device)")
        return v

    @field_validator("logprob_diff_limit", mode="before")
    @classmethod
    def _auto_number_or_null(cls, v: Any) -> Any:
        if v is None or v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise ValueError("must be 'auto', a number > 0 or null (reported only)")
        return float(v)

    @field_validator("ref_path")
    @classmethod
    def _ref_is_a_directory(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not Path(v).is_dir():
            raise ValueError("not a directory (an HF-format model directory is expected)")
        return v

    @model_validator(mode="after")
    def _decoupled_needs_recompute(self) -> "ActorConfig":
        if self.use_decoupled_loss and not self.recompute_logprob:
            raise ValueError("use_decoupled_loss requires recompute_logprob: true")
        return self

    def _layout(self) -> tuple[list[str], int, str]:
        return trainer_layout({"device": self.device, "devices": self.devices,
                               "num_ranks": self.num_ranks, "sharding": self.sharding})

    @property
    def rank_devices(self) -> list[str]:
        """The CUDA device of each trainer rank; empty on CPU."""
        return self._layout()[0]

    @property
    def world_size(self) -> int:
        return self._layout()[1]

    @property
    def strategy(self) -> str:
        """'none', 'fsdp' or 'ddp': `sharding` with auto resolved."""
        return self._layout()[2]


# Mean |trainer - inference| logprob a correct engine stays far below: float32 on both sides agrees to
# ~1e-6 (vLLM's kernels vs torch's, CPU) and ~1e-5 on GPU; a bf16/fp16 side or a vLLM KV cache kept
# across reloads (inference.vllm.recompute_kv_on_reload=false) to ~1e-3-1e-2. Dropped or stale
# weights are 0.05 nats and more (issue #22: a skipped o_proj.bias was 0.17-0.23).
EXACT_DIFF_LIMIT, ROUNDED_DIFF_LIMIT = 1e-3, 0.1


def logprob_diff_default(cfg) -> float:
    """`actor.logprob_diff_limit: auto` for a run config: EXACT_DIFF_LIMIT when the trainer
    (actor.param_dtype or model.dtype) and the inference engine (model.dtype; vLLM: its
    `inference.vllm.dtype`, auto being bfloat16 on GPU for a float32 model) both compute in float32
    and every token is sampled under the weights it is stamped with, ROUNDED_DIFF_LIMIT otherwise."""
    inf, model = cfg.inference, cfg.model.dtype
    engine = model
    if inf.backend == "vllm":
        engine = inf.vllm.dtype if inf.vllm.dtype != "auto" else (
            "bfloat16" if inf.devices and model == "float32" else model)
    trainer = cfg.actor.param_dtype or model
    exact = engine == trainer == "float32" and not (
        inf.backend == "vllm" and not inf.vllm.recompute_kv_on_reload)
    return EXACT_DIFF_LIMIT if exact else ROUNDED_DIFF_LIMIT


def trainer_layout(actor: dict) -> tuple[list[str], int, str]:
    """(rank devices, ranks, sharding with auto resolved) of an `actor` section as plain data (a
    resolved config, or one saved in a checkpoint before these fields existed)."""
    devices = list(actor.get("devices") or [])
    device = actor.get("device", "cpu")
    devices = devices or ([device] if device != "cpu" else [])
    world = len(devices) or int(actor.get("num_ranks", 1))
    sharding = actor.get("sharding", "auto")
    if sharding == "auto":
        sharding = "none" if world == 1 else "fsdp"
    return devices, world, sharding
