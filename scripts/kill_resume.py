"""Kill-and-resume soak: kill -9 the supervisor at random moments, resume, check recovery.

    python scripts/kill_resume.py --config configs/sim.yaml --kills 3 [--seed 0] [key=value ...]

Each round starts `python -m orchestrator.launch ... run.resume=auto`, waits a random time, and
kill -9's the supervisor. Checked: every child is gone within 5 s of each kill; after the final
(uninterrupted) resume no /dev/shm entry of any of these runs is left; step lines are contiguous
1..run.total_steps with no duplicate; each first step after a resume admitted at most (S+1)*B;
the final step equals the target. Prints a JSON summary; exit 0 when every check holds, 1 if not.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _launch(config, run_dir, overrides):
    return subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config", config,
                             f"run.dir={run_dir}", "run.resume=auto", *overrides],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _segments_of(pids):
    prefixes = tuple(f"arl_{p}-" for p in pids)
    return sorted(n for n in os.listdir("/dev/shm") if n.removeprefix("sem.").startswith(prefixes))


def _kill_round(config, run_dir, overrides, delay):
    proc = _launch(config, run_dir, overrides)
    deadline = time.monotonic() + delay
    children = []
    while time.monotonic() < deadline and proc.poll() is None:
        try:   # remember every worker seen, including restarted ones
            children += [c for c in psutil.Process(proc.pid).children(recursive=True)
                         if c not in children]
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        return {"pid": proc.pid, "killed": False, "returncode": proc.returncode}
    os.kill(proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    proc.wait(10)
    _, alive = psutil.wait_procs(children, timeout=5.0)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return {"pid": proc.pid, "killed": True, "delay_s": round(delay, 3), "children": len(children),
            "children_alive_after_5s": len(alive), "children_gone_s": round(time.monotonic() - t0, 3)}


def check(run_dir, pids) -> dict:
    cfg = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    target = cfg["run"]["total_steps"]
    bound = (cfg["rollout"]["max_head_offpolicyness"] + 1) * cfg["rollout"]["consumer_batch_size"]
    steps = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"step"' in l]
    steps = [r for r in steps if r["kind"] == "step"]
    numbers = [r["step"] for r in steps]
    resumed = [r for r in steps if r["resumed"]]
    return {
        "steps_contiguous": numbers == list(range(1, len(numbers) + 1)),
        "final_step_is_target": bool(numbers) and numbers[-1] == target,
        "bound_kept_on_resume": all(r["admitted"] <= bound for r in resumed),
        "resumed_steps": [r["step"] for r in resumed],
        "resumed_admitted": [r["admitted"] for r in resumed],
        "shm_leftovers": _segments_of(pids),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/sim.yaml")
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-delay", type=float, default=1.0, help="earliest kill after start (s)")
    ap.add_argument("--max-delay", type=float, default=3.0, help="latest kill after start (s)")
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="limit for the final resume (s)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="kill_resume_")
    rounds, pids = [], []
    for _ in range(args.kills):
        r = _kill_round(args.config, run_dir, args.overrides, rng.uniform(args.min_delay, args.max_delay))
        rounds.append(r)
        pids.append(r["pid"])
    final = _launch(args.config, run_dir, args.overrides)
    _, err = final.communicate(timeout=args.timeout)
    pids.append(final.pid)
    result = {"run_dir": run_dir, "rounds": rounds, "final_returncode": final.returncode}
    if final.returncode != 0:
        result["final_stderr"] = err.strip().splitlines()[-3:]
    result.update(check(run_dir, pids) if final.returncode == 0 else {})
    ok = (final.returncode == 0 and result["steps_contiguous"] and result["final_step_is_target"]
          and result["bound_kept_on_resume"] and not result["shm_leftovers"]
          and all(r.get("children_alive_after_5s", 0) == 0 for r in rounds))
    result["ok"] = ok
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
