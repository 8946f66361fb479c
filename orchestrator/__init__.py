"""Single-node asynchronous RL orchestrator.

Layers, bottom to top (imports only go down; tests/unit/test_layers.py holds it): `config`,
`messages`, `errors`, `wire` (modules at the top of the package, used by every room) < `run/` (the
run directory) < `data/` (workloads) < `envs/` (environments) < `algo/` (training math) <
`observe/` (metrics, reports) < `loop/` (the event thread) < `runtime/` + `backends/` (processes,
engines) < the entry points `launch`, `report`, `inspect`, `audit`, `export`
(`python -m orchestrator.<name>`) and `gate` (the gate's contract name).
"""
