"""`Config`: the whole run, its sections, and the checks that span sections (one place).
`env_spec` and `deterministic_refusal`: the run-level answers that read the whole config."""
from __future__ import annotations

from typing import Optional

import yaml
from pydantic import Field, PrivateAttr, model_validator

from orchestrator.config.base import _Section
from orchestrator.config.run import RunConfig
from orchestrator.config.inference import InferenceConfig
from orchestrator.config.actor import TINY_LINEAR, ActorConfig, logprob_diff_default
from orchestrator.config.model import ModelConfig
from orchestrator.config.task import TaskConfig
from orchestrator.config.rollout import RolloutConfig, EvalConfig
from orchestrator.config.observe import MetricsConfig
from orchestrator.config.placement import WeightsConfig, PlacementConfig
from orchestrator.config.algo import AlgoConfig


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
        if task.own_data and inf.backend == "sim":
            raise ValueError(f"{task.data_key} with inference.backend sim: the sim backend generates no "
                             "text to reward (use torch or vllm)")
        if task.own_data and self.eval.every_steps and not task.has_eval_data:
            need = "task.eval_dataset" if task.dataset is not None else "an eval_path on a source"
            raise ValueError(f"eval.every_steps={self.eval.every_steps} with {task.data_key} needs "
                             f"{need} (or eval.every_steps=0; load_config turns eval off with a "
                             f"warning)")
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


def env_spec(cfg: Config) -> Optional[str]:
    """What runs the task's multi-turn episodes: `task.env` (task.name=lookup implies `lookup`) or
    `task.agent` (an agent over HTTP), or None for a single-turn task."""
    if cfg.task.agent is not None:
        return cfg.task.agent
    return cfg.task.env or ("lookup" if cfg.task.name == "lookup" else None)


def deterministic_refusal(cfg: Config) -> Optional[str]:
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
