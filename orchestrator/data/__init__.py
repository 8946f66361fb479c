"""Workloads: what is trained on, and how it is scored.

- `workload`: the builder, the one place that turns `task.*` and `model.path` into a prompt source
  (`build_task`) and a worker's scorer (`build_scorer`: reward pool or episode runner).
- `tokens`: the model's tokenizer, stop and pad ids, prompt rendering; the built-in character tokenizer.
- `digits`: the built-in digit tasks (copy2, ...), generated datasets and rewards.
- `prompt_set`: datasets opened with `datasets` (JSONL, Parquet, save_to_disk), every prompt rendered
  once; epochs as full permutations.
- `rewards`, `reward_pool`: built-in and user rewards, scored on a bounded pool with timeouts.
- `budgets`: token budgets known from the config (longest prompt, completion, episode, context).

Imports: config, errors and this room; `workload` alone also assembles the environment (`envs`).
"""
