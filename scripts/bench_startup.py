"""Time to the first step line of the default job, against the import floor measured in the same
run.

    python scripts/bench_startup.py [--rounds 3] [--config configs/default.yaml]

Each round, interleaved: (1) `python -c "import torch, transformers"` (what any worker of a torch
job must pay: the floor), (2) a launch of the job (`run.total_steps=2`, no eval) timed from the
process start to the first `kind: step` line in metrics.jsonl, and to its exit. The table prints
medians with the min-max spread, and each time over the import floor.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def floor_s() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, transformers"], check=True, cwd=ROOT)
    return time.perf_counter() - t


def first_step_s(config: str, run_dir: str) -> tuple[float, float]:
    """(seconds to the first step line, seconds to exit) of one launch."""
    metrics = os.path.join(run_dir, "metrics.jsonl")
    t = time.perf_counter()
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
    return (first if first is not None else total), total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", default="configs/default.yaml")
    args = ap.parse_args(argv)
    floors, firsts, totals = [], [], []
    with tempfile.TemporaryDirectory(prefix="arl-bench-startup-") as tmp:
        for r in range(args.rounds):
            floors.append(floor_s())
            first, total = first_step_s(args.config, os.path.join(tmp, f"run{r}"))
            firsts.append(first)
            totals.append(total)
    med = statistics.median
    print(f"bench_startup: {args.config}, {args.rounds} rounds, {os.cpu_count()} cpus")
    print(f"{'measure':34s} {'median s':>9s} {'(min-max)':>15s} {'/ floor':>8s}")
    for label, xs in (("import torch, transformers (floor)", floors), ("launch -> first step line", firsts),
                      ("launch -> exit (2 steps)", totals)):
        print(f"{label:34s} {med(xs):9.2f} {f'({min(xs):.2f}-{max(xs):.2f})':>15s} "
              f"{med(xs) / med(floors):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
