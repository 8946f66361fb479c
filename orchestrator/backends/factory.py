"""Build the configured backends inside a worker process (heavy imports happen only here)."""
from __future__ import annotations

import os

import numpy as np

from orchestrator.config import Config
from orchestrator.data.workload import build_scorer


def sampling_seed(cfg: Config, index: int, gen: int, start_step: int) -> int:
    """Sampling RNG of inference worker `index` (restart generation `gen`) in a run (re)started at
    `start_step`: every worker, restart and resume draws a fresh, reproducible stream."""
    return int(np.random.SeedSequence([cfg.run.seed, index, gen, start_step]).generate_state(1)[0])


def deterministic_torch(cfg: Config) -> None:
    """run.deterministic in a torch worker: deterministic kernels only (an op without one fails the
    run naming it), cuBLAS with a fixed workspace (set before the first CUDA call), and the global
    generator (dropout, anything drawing from torch's default stream) seeded by run.seed."""
    if not cfg.run.deterministic:
        return
    import torch
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.run.seed)


def build_inference(cfg: Config, index: int, gen: int = 0, start_step: int = 0,
                    prompt_tokens: int = 0):
    """Return (backend, scorer or None): the scorer is the reward pool, or the episode runner of a
    multi-turn task (`task.env`); None when the backend decides its own rewards (sim)."""
    seed = sampling_seed(cfg, index, gen, start_step)
    if cfg.inference.backend == "sim":
        from orchestrator.backends.sim_inference import SimInference
        return SimInference(cfg.inference.sim, seed=seed, weight_bytes=cfg.actor.sim.weight_bytes,
                            latency_seed=cfg.run.seed), None
    if cfg.inference.backend == "torch":
        from orchestrator.backends.torch_inference import TorchInference
        deterministic_torch(cfg)
        device = "cuda:0" if cfg.inference.devices else "cpu"
        backend = TorchInference(cfg.model, cfg.task, cfg.rollout, cfg.inference, seed=cfg.run.seed,
                                 device=device, sample_seed=seed)
        return backend, build_scorer(cfg, backend.tokens, seed)
    if cfg.inference.backend == "vllm":
        from orchestrator.backends.vllm_inference import VllmInference
        backend = VllmInference(cfg, index, sample_seed=seed, prompt_tokens=prompt_tokens)
        return backend, build_scorer(cfg, backend.tokens, seed)
    raise ValueError(f"unknown inference.backend {cfg.inference.backend!r}")


def build_trainer(cfg: Config):
    if cfg.actor.backend == "sim":
        from orchestrator.backends.sim_trainer import SimTrainer
        return SimTrainer(cfg.actor.sim)
    if cfg.actor.backend == "torch":
        from orchestrator.backends.torch_trainer import TorchTrainer
        deterministic_torch(cfg)
        from orchestrator.backends.model import resolve_device
        device = resolve_device("cuda:0" if cfg.actor.rank_devices else "cpu")  # each rank sees its own
        group = None
        if cfg.actor.strategy != "none":    # ranks: join the group the supervisor set up
            from orchestrator.backends.sharding import RankGroup
            group = RankGroup.from_env(cfg.actor, device)
        return TorchTrainer(cfg.model, cfg.actor, cfg.task, seed=cfg.run.seed, device=device,
                            temperature=cfg.rollout.temperature, total_steps=cfg.run.total_steps,
                            group=group, algo=cfg.algo,
                            adapter_only=cfg.inference.backend == "vllm" and cfg.inference.vllm.lora)
    raise ValueError(f"unknown actor.backend {cfg.actor.backend!r}")
