"""Each learning soak on several seeds: per-seed figures, then min / median / max and how many seeds
hold the soak's test bound, so that a bound is set from a sweep rather than from one lucky seed.

    python scripts/sweep_soaks.py [--soaks multiturn,default] [--seeds 0-7] [--set KEY=VALUE ...]
                                  [--runs-dir DIR] [--json FILE]

A soak is the launch its test makes (`tests/integration/test_*_learns.py`) and the test's own
criterion: `default` and `default-2ranks` (configs/default.yaml with run.deterministic=true:
last-10 reward >= 0.8, >= 0.5 above the first 10), `multiturn` (configs/multiturn.yaml with
run.deterministic=true: last-10 >= 0.57, >= 0.5 above the first 10), and each recipe preset
`recipe-NAME` (configs/recipes/NAME.yaml with run.deterministic=true, 200 steps, dapo 400: the
last 50 steps' mean >= 0.3 above the first 50's), `lora` (test_lora_learns: the default job
with LoRA rank 8 on every linear layer and the head, run.deterministic=true, 600 steps: the same
gain), and
`lora-rates` (scripts/soak_lora_rates.py:
full fine-tuning and LoRA at 10x / 5x / 2x its rate on a pretrained base; its figures are the
default LoRA run's first and last 50, and its bound the comparison's). `--set` adds overrides to every run (a variant:
e.g. `--set actor.entropy_coef=0.06`). Runs go one at a time (each launch uses the machine's
cores), each in `--runs-dir/SOAK-sSEED` (a temporary directory by default, removed at the end); a
run that does not exit 0 counts as failing its bound and its stderr's last line is printed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Soak:
    config: str
    window: int                # steps averaged at each end
    last_min: float            # the window's mean at the end must reach this (0: no such bound)
    gain_min: float            # and exceed the first window's by this
    overrides: tuple = field(default_factory=tuple)
    runner: Optional[Callable[[Path, int, list], dict]] = None   # a soak of several launches
    bound: Optional[str] = None                                   # its bound, said in words

    def holds(self, first: float, last: float) -> bool:
        return last >= self.last_min and last - first >= self.gain_min


def soaks() -> dict[str, Soak]:
    det = ("run.deterministic=true",)         # as their tests run them (test_default_learns)
    out = {"default": Soak("configs/default.yaml", 10, 0.8, 0.5, det),
           "default-2ranks": Soak("configs/default.yaml", 10, 0.8, 0.5, (*det, "actor.num_ranks=2")),
           "multiturn": Soak("configs/multiturn.yaml", 10, 0.57, 0.5, det)}
    for path in sorted((ROOT / "configs" / "recipes").glob("*.yaml")):
        steps = 400 if path.stem == "dapo" else 200
        out[f"recipe-{path.stem}"] = Soak(str(path.relative_to(ROOT)), 50, 0.0, 0.3,
                                          (f"run.total_steps={steps}", "eval.every_steps=0", *det))
    head = "actor.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"
    out["lora"] = Soak("configs/default.yaml", 50, 0.0, 0.3,
                       (*det, "run.total_steps=600", "actor.lora.rank=8", head))
    out["lora-rates"] = Soak("configs/default.yaml", 50, 0.0, 0.0, runner=lora_rates,
                             bound="LoRA's first 50 >= full's - 0.1 at every rate, the default's "
                                   "last 50 too")
    return out


def lora_rates(runs: Path, seed: int, extra: list[str]) -> dict:
    """The `lora-rates` soak on one seed (soak_lora_rates.compare), as a run_one result: first and
    last are the default LoRA run's, and the per-run figures ride along."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from scripts.soak_lora_rates import RATES, compare

    try:
        r = compare(runs, seed, tuple(extra))
    except (RuntimeError, subprocess.SubprocessError) as e:
        return {"seed": seed, "ok": False, "error": str(e)}
    default = r[f"lora{RATES[0]}x"]
    return {**r, "first": default["first"], "last": default["last"],
            "gain": round(default["last"] - default["first"], 4)}


def seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def run_one(soak: Soak, seed: int, run_dir: Path, extra: list[str]) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config", soak.config,
                           f"run.dir={run_dir}", "run.progress=false", f"run.seed={seed}",
                           *soak.overrides, *extra], cwd=ROOT, capture_output=True, text=True)
    out = {"seed": seed, "rc": proc.returncode, "s": round(time.monotonic() - t0, 1)}
    try:
        recs = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    except (OSError, json.JSONDecodeError):
        recs = []
    rewards = [r["reward_mean"] for r in recs if r.get("kind") == "step"]
    evals = [r["reward_mean"] for r in recs if r.get("kind") == "eval"]
    if proc.returncode != 0 or len(rewards) < 2 * soak.window:
        err = proc.stderr.strip().splitlines()
        return {**out, "ok": False, "error": err[-1] if err else f"{len(rewards)} step lines"}
    first = statistics.fmean(rewards[:soak.window])
    last = statistics.fmean(rewards[-soak.window:])
    return {**out, "first": round(first, 4), "last": round(last, 4),
            "gain": round(last - first, 4), "eval_last": round(evals[-1], 4) if evals else None,
            "ok": soak.holds(first, last)}


def summary(name: str, soak: Soak, results: list[dict]) -> str:
    lasts = sorted(r["last"] for r in results if "last" in r)
    held = sum(r["ok"] for r in results)
    bound = (f"last >= {soak.last_min:g}, " if soak.last_min else "") + f"gain >= {soak.gain_min:g}"
    bound = soak.bound or bound
    if not lasts:
        return f"{name}: no run finished; holds {held}/{len(results)} ({bound})"
    return (f"{name}: last-{soak.window} reward min {lasts[0]:.3f} / median "
            f"{statistics.median(lasts):.3f} / max {lasts[-1]:.3f} over {len(lasts)} runs; holds "
            f"{held}/{len(results)} ({bound})")


def main(argv=None) -> int:
    known = soaks()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--soaks", default=",".join(known), help=f"comma list of: {', '.join(known)}")
    p.add_argument("--seeds", default="0-7", help="e.g. 0-7 or 0,3,5")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override for every run (repeatable)")
    p.add_argument("--runs-dir", default=None, help="keep the runs here (default: a temporary dir)")
    p.add_argument("--json", default=None, help="write every result here as JSON")
    args = p.parse_args(argv)
    names = [n for n in args.soaks.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown soak(s) {', '.join(unknown)}; known: {', '.join(known)}",
              file=sys.stderr)
        return 2
    tmp = None if args.runs_dir else tempfile.TemporaryDirectory(prefix="sweep-soaks-")
    base = Path(args.runs_dir or tmp.name)
    results: dict[str, list[dict]] = {}
    try:
        for name in names:
            soak = known[name]
            for seed in seeds(args.seeds):
                if soak.runner is not None:
                    r = soak.runner(base / name, seed, args.set)
                else:
                    r = run_one(soak, seed, base / f"{name}-s{seed}", args.set)
                results.setdefault(name, []).append(r)
                print(f"{name} seed {seed}: " + ", ".join(f"{k} {v}" for k, v in r.items()
                                                          if k != "seed"), flush=True)
        for name in names:
            print(summary(name, known[name], results[name]))
        if args.json:
            Path(args.json).write_text(json.dumps({"set": args.set, "results": results}, indent=1))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
