"""Processes and their lifecycle: who runs, on which device, with which shared memory, and how they end.

- `supervisor`: owns every process, shm segment and semaphore of a run; spawns, watches, restarts, frees.
- `resources`: the names and sizes of every shared-memory object of a run (rings, weights, words).
- `worker_base`, `inference_worker`, `trainer_worker`: the worker processes around their main loops.
- `forkserver`, `fork_server_init`: the run's fork server, which imports the workers' modules once and
  forks every worker.
- `placement`: each worker's devices, threads and environment (its `WorkerSpec`).
- `ray_cluster`, `ray_host`: `placement.mode: ray`, inference workers hosted by Ray actors on a
  cluster's nodes (the driver's side and the node's); Ray is imported there only. `ray_weights`:
  the gloo pair (torch.distributed) that carries weights to a host on another node.
- `rank_failures`: trainer ranks fail together; the supervisor names the cause.
- `liveness`: a stamp thread per worker, so a worker that stops answering is noticed in seconds.
- `background_save`: checkpoints off the trainer's critical path.
- `signals`: SIGINT/SIGTERM of the launch process, caught from its first instant.
- `scratch`: the run's scratch directory (engines' temp files), swept like its segments.
- `preflight`: the machine checks of a validated config, before anything starts.

The engines and trainers the workers drive are `orchestrator.backends`. Imports may go down to every
other room (loop, observe, algo, envs, data, run, backends); nothing below imports this one.
"""
