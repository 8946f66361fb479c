"""Time to the first step line of the default job, and the CPU its processes spend, against import
floors measured in the same run.

    python scripts/bench_startup.py [--rounds 3] [--config configs/default.yaml]

Each round, interleaved: (1) `python -c "import torch, transformers"` (what any worker of a torch
job must pay: the floor), (2) an interpreter importing the modules a run's fork server preloads on
a CPU torch job (`orchestrator.runtime.forkserver`: the workers' modules, torch, transformers'
Llama and the torch backends): what every worker, trainer rank and restart paid under the spawn
start method, and what a run now pays once, (3) a launch of the job (`run.total_steps=2`, no eval)
timed from the process start to the first `kind: step` line in metrics.jsonl, and to its exit.
The table prints medians with the min-max spread and each wall time over the first floor; the CPU
table the CPU seconds (user + system, the process and every descendant it reaped) of the preload
import and of the whole launch, and the launch's over the preload's: one worker's imports plus the
supervisor's under the fork server (~1.3), where spawn paid one import per worker on top.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


PRELOAD = ("import importlib; from orchestrator.runtime.forkserver import TORCH, WORKERS; "
           "[importlib.import_module(m) for m in WORKERS + TORCH]")


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def floor_s(code: str = "import torch, transformers") -> tuple[float, float]:
    """(wall s, CPU s) of a fresh interpreter running `code`."""
    t, c = time.perf_counter(), children_cpu_s()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return time.perf_counter() - t, children_cpu_s() - c


def first_step_s(config: str, run_dir: str) -> tuple[float, float, float]:
    """(seconds to the first step line, seconds to exit, CPU seconds) of one launch."""
    metrics = os.path.join(run_dir, "metrics.jsonl")
    t, c = time.perf_counter(), children_cpu_s()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config", config,
                             f"run.dir={run_dir}", "run.total_steps=2", "eval.every_steps=0",
                             "run.progress=false", "run.resume=never"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while first is None and proc.poll() is None:
        if os.path.exists(metrics):
            with open(metrics) as f:
                if any(json.loads(line).get("kind") == "step" for line in f if line.strip()):
                    first = time.perf_counter() - t
        time.sleep(0.01)
    _, err = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"launch failed: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}")
    total = time.perf_counter() - t
    return (first if first is not None else total), total, children_cpu_s() - c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", default="configs/default.yaml")
    args = ap.parse_args(argv)
    floors, preloads, firsts, totals, pre_cpu, launch_cpu = [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="arl-bench-startup-") as tmp:
        for r in range(args.rounds):
            floors.append(floor_s()[0])
            wall, cpu = floor_s(PRELOAD)
            preloads.append(wall)
            pre_cpu.append(cpu)
            first, total, cpu = first_step_s(args.config, os.path.join(tmp, f"run{r}"))
            firsts.append(first)
            totals.append(total)
            launch_cpu.append(cpu)
    med = statistics.median

    def spread(xs):
        return f"({min(xs):.2f}-{max(xs):.2f})"

    print(f"bench_startup: {args.config}, {args.rounds} rounds, {os.cpu_count()} cpus")
    print(f"{'wall':38s} {'median s':>9s} {'(min-max)':>15s} {'/ floor':>8s}")
    for label, xs in (("import torch, transformers (floor)", floors),
                      ("import the fork server's preload", preloads),
                      ("launch -> first step line", firsts), ("launch -> exit (2 steps)", totals)):
        print(f"{label:38s} {med(xs):9.2f} {spread(xs):>15s} {med(xs) / med(floors):8.2f}")
    ratios = [c / p for c, p in zip(launch_cpu, pre_cpu)]
    print(f"{'CPU (user + system)':38s} {'median s':>9s} {'(min-max)':>15s}")
    label = "import the fork server's preload"
    print(f"{label:38s} {med(pre_cpu):9.2f} {spread(pre_cpu):>15s}")
    print(f"{'launch, every process (2 steps)':38s} {med(launch_cpu):9.2f} {spread(launch_cpu):>15s}")
    print(f"launch CPU / preload CPU: {med(ratios):.2f} {spread(ratios)} (per round)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
