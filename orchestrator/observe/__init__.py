"""Observability: what a person (or a dashboard) sees of a run, live or afterwards.

- `metrics`: the `metrics.jsonl` writer (`MetricsLog`) and the metrics thread's ticks.
- `progress`: the console progress line and the summary paragraph at the end of a run.
- `sinks`: TensorBoard and Weights & Biases beside `metrics.jsonl` (imported only when enabled).
- `report`: plots and a health summary of a run directory (`python -m orchestrator.report`).
- `inspect`: a trained batch, decoded (`python -m orchestrator.inspect`).

Imports: config, messages, errors, the run directory's readers (`orchestrator.run`), data's tokenizer
and the per-token version math (`orchestrator.algo.stamp`); it reads files and messages only and
never imports the loop, the runtime or a backend.
"""
