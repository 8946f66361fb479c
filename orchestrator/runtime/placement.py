"""Where each worker runs: its devices, CPU threads and environment, as the `WorkerSpec` it starts with.

`worker_spec(cfg, names, role, i, run_dir, scratch_dir, ...)`:
- a trainer rank gets its own CUDA device (`actor.rank_devices`, none on CPU), `actor.threads`, the
  run's scratch directory and, with more than one rank, the torch.distributed environment for the
  run's rendezvous port (no torchrun);
- inference worker `i` gets its share of `inference.devices` (`len // num_workers` each, in order),
  plus trainer rank 0's GPU as its last ordinal when weights travel over CUDA IPC
  (`cfg.gpu_weights`; a colocated trainer's GPU is already its own), and
  `inference.threads_per_worker`.
The spec's `parent_pid` is the supervisor's until the fork server's pid replaces it at start
(`orchestrator.runtime.forkserver`).
"""
from __future__ import annotations

import os

from orchestrator.config import Config
from orchestrator.runtime import rank_failures, scratch
from orchestrator.runtime.resources import RunNames
from orchestrator.runtime.worker_base import WorkerSpec


def worker_spec(cfg: Config, names: RunNames, role: str, i: int, run_dir: str, scratch_dir: str,
                rendezvous_port: int = 0, gen: int = 0, start_step: int = 0,
                prompt_tokens: int = 0) -> WorkerSpec:
    data = cfg.model_dump(mode="json")
    env = {scratch.ENV: scratch_dir}
    if role == "trainer":
        ranks = cfg.actor.rank_devices
        if cfg.actor.strategy != "none":      # torch.distributed reads these (no torchrun)
            env.update(rank_failures.rendezvous_env(i, cfg.actor.world_size, rendezvous_port))
        return WorkerSpec("trainer", i, names, data, os.getpid(), run_dir,
                          devices=(ranks[i],) if ranks else (), threads=cfg.actor.threads, env=env)
    devs = cfg.inference.devices
    per = max(1, len(devs) // cfg.inference.num_workers) if devs else 0
    own = tuple(devs[i * per:(i + 1) * per])
    trainer_gpu = cfg.actor.rank_devices[0] if cfg.gpu_weights else None
    if trainer_gpu is not None and trainer_gpu not in own:   # CUDA IPC needs trainer rank 0's
        own += (trainer_gpu,)       # GPU visible, as the last ordinal (colocated: it is own's)
    return WorkerSpec("inference", i, names, data, os.getpid(), run_dir, gen=gen,
                      start_step=start_step, prompt_tokens=prompt_tokens, devices=own,
                      threads=cfg.inference.threads_per_worker, env=env)
