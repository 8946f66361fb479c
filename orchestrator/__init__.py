"""Single-node asynchronous RL orchestrator: supervisor, gate, sinks, workers."""
