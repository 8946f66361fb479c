"""The supervisor's event thread and its components: every decision about prompts, rollouts and
versions is made here, on one thread, from messages and counters.

- `event_loop`: one turn = admit -> dispatch -> collect -> stamp -> sinks -> ship hold -> trainer;
  its checkpoint requests and resume reuse (`loop_checkpoints`) and its side of a worker's death
  and restart (`worker_events`) are mixins of its class; `checkpoints` keeps the commit book.
- `gate`: admission by AReaL's staleness formula (`StalenessGate`, also `orchestrator.gate`).
- `dispatcher`: admitted prompts to inference workers, per-worker control outbox, pause/resume.
- `age_bound`: the hard bound on every trained token's head age (`rollout.max_observed_offpolicyness`).
- `watcher`: the trainer's published version -> inference reloads -> the version the gate reads.
- `train_sink`, `eval_sink`: finished groups -> advantages -> batches; eval rounds -> reports.
- `prompts`: the deterministic prompt stream (`index -> prompt`), epochs as full permutations.
- `validate`: every rollout group checked against the request it answers.

Imports: config, messages, errors, wire, and the rooms below (algo, envs, data, run, observe's
metrics log). Never the runtime: the loop drives no process, it talks over rings it is handed.
"""
