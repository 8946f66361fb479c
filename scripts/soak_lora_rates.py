"""LoRA against full fine-tuning on a pretrained base, at the rates the field uses for LoRA (issue
#39): the comparison `tests/integration/test_lora_rates.py` asserts and `scripts/sweep_soaks.py`
sweeps (soak `lora-rates`).

    python scripts/soak_lora_rates.py [--seed 0] [--runs-dir DIR]

The base is the embedded default job (copy2, full fine-tuning, run.seed 0, run.deterministic)
exported with `orchestrator.export`; on it, task.name=reverse2 for 300 steps, deterministic, seed
`--seed`: full fine-tuning at the default actor.lr (1e-3), then LoRA rank 8 with every other key
at its default (alpha sqrt(hidden_size), LoRA+ ratio 16) at actor.lora.lr_scale 10 (the default:
B at 10x full fine-tuning's rate), 5 and 2. Figures: each run's mean reward over its first and
last 50 steps. It holds when no LoRA rate's first 50 falls more than 0.1 below full fine-tuning's
(the first updates do not hurt) and the default's last 50 is within 0.1 of full fine-tuning's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS, WINDOW, SLACK = 300, 50, 0.1
RATES = (10, 5, 2)                  # actor.lora.lr_scale: B's rate over full fine-tuning's
TASK = ("task.name=reverse2", f"run.total_steps={STEPS}", "eval.every_steps=0")


def _launch(run_dir: Path, *overrides: str) -> list[float]:
    """The step lines' reward_mean of one deterministic launch (a failed launch: RuntimeError
    with its stderr's last line)."""
    proc = subprocess.run([sys.executable, "-m", "orchestrator.launch", f"run.dir={run_dir}",
                           "run.progress=false", "run.deterministic=true", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise RuntimeError(f"{run_dir.name}: exit {proc.returncode}: {lines[-1] if lines else ''}")
    recs = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [r["reward_mean"] for r in recs if r.get("kind") == "step"]


def base_model(runs: Path) -> Path:
    """The pretrained base: the default job's final checkpoint exported as an HF directory
    (made once per `runs` directory)."""
    out = runs / "base-hf"
    if not (out / "config.json").exists():
        _launch(runs / "base", "run.seed=0")
        subprocess.run([sys.executable, "-m", "orchestrator.export", str(runs / "base"), str(out)],
                       cwd=ROOT, check=True, capture_output=True, timeout=300)
    return out


def compare(runs: Path, seed: int, extra: tuple = ()) -> dict:
    """Full fine-tuning and LoRA at each of RATES on the base, seed `seed`: first / last window
    means and whether the soak holds. `extra`: overrides for every run on the base."""
    base = base_model(runs)
    common = (f"model.path={base}", f"run.seed={seed}", *TASK, *extra)

    def ends(rewards: list[float]) -> dict:
        return {"first": round(statistics.fmean(rewards[:WINDOW]), 4),
                "last": round(statistics.fmean(rewards[-WINDOW:]), 4)}

    out = {"seed": seed, "full": ends(_launch(runs / f"full-s{seed}", *common))}
    for scale in RATES:
        out[f"lora{scale}x"] = ends(_launch(runs / f"lora{scale}x-s{seed}", *common,
                                            "actor.lora.rank=8", f"actor.lora.lr_scale={scale}"))
    full = out["full"]
    out["ok"] = (all(out[f"lora{s}x"]["first"] >= full["first"] - SLACK for s in RATES)
                 and out[f"lora{RATES[0]}x"]["last"] >= full["last"] - SLACK)
    return out


def line(r: dict) -> str:
    runs = ", ".join(f"{k} {v['first']:.3f} -> {v['last']:.3f}" for k, v in r.items()
                     if isinstance(v, dict))
    return f"seed {r['seed']}: {runs}; holds {r['ok']}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default=None, help="keep the runs here (default: a temporary dir)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lora-rates-") as tmp:
        r = compare(Path(args.runs_dir or tmp), args.seed)
    print(line(r))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
