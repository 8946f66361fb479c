"""The Python half of scripts/gpu_check.sh: the machine probe, the wheelhouse's dependency check,
and the report (one JSON file and the README's performance rows).

    python scripts/gpu_check.py probe                 # one line; exit 2 without torch or CUDA
    python scripts/gpu_check.py deps SITE             # every wheel installed in SITE has its needs met
    python scripts/gpu_check.py report LOGDIR OUT DATE

- probe: imports torch only (nothing of the project, which is not installed yet) and prints
  `torch V, CUDA C, N x NAME`; without torch or without a CUDA device it says so in one line, exit 2.
- deps: the wheelhouse is installed with --no-deps (pip would otherwise try to install torch, which
  --target hides), so this checks what pip would have: each distribution in SITE has every
  requirement (markers evaluated, no extras) met by what this interpreter sees (SITE first, then the
  image's own packages, e.g. the numpy and pyarrow the wheelhouse leaves to the image). Unmet: one
  line naming them and who needs them, exit 2.
- report: reads LOGDIR/steps.tsv (name, exit status, seconds, limit: one line per step), the benches'
  JSON files and the default job's metrics.jsonl, writes OUT and prints README rows dated DATE.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def probe() -> int:
    try:
        import torch
    except ImportError as exc:
        print(f"gpu_check: no torch here ({exc}): run it with the GPU machine's CUDA torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}): "
              f"run it on a GPU machine", file=sys.stderr)
        return 2
    n = torch.cuda.device_count()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {n} x {torch.cuda.get_device_name(0)}")
    return 0


def deps(site: str) -> int:
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()
                 if d.metadata["Name"]}                 # sys.path order: SITE (PYTHONPATH) first
    unmet = []
    for dist in metadata.distributions(path=[site]):
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed.get(canonicalize_name(req.name))
            if have is None or not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{req} (for {dist.metadata['Name']}; here: {have or 'none'})")
    if unmet:
        print(f"gpu_check: the wheelhouse needs what this machine lacks: {'; '.join(sorted(set(unmet)))}"
              f" (carry those wheels: scripts/wheelhouse.sh --assume)", file=sys.stderr)
        return 2
    return 0


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _job(run_dir: Path) -> dict | None:
    try:
        recs = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    except (OSError, ValueError):
        return None
    steps = [r for r in recs if r.get("kind") == "step"]
    if len(steps) < 2:
        return None
    tail = steps[len(steps) // 2:]
    span = tail[-1]["time"] - tail[0]["time"]
    return {"steps": len(steps), "steps_per_s": (len(tail) - 1) / span if span > 0 else None,
            "reward_first": steps[0]["reward_mean"], "reward_last": statistics.mean(
                r["reward_mean"] for r in steps[-10:]),
            "weight_sync_s": statistics.median(r["weight_sync_s"] for r in tail),
            "age_max": max(r["age_max"] for r in steps)}


def report(logdir: str, out: str, date: str) -> int:
    log = Path(logdir)
    steps = {}
    for line in (log / "steps.tsv").read_text().splitlines() if (log / "steps.tsv").exists() else []:
        name, rc, secs, limit = line.split("\t")
        steps[name] = {"rc": int(rc), "seconds": float(secs), "limit_s": int(limit)}
    result = {"date": date, "machine": (log / "machine.txt").read_text().strip()
              if (log / "machine.txt").exists() else "unknown", "steps": steps,
              "default_job": _job(log / "default_job"),
              "default_job_overrides": (log / "default_job.args").read_text().split()
              if (log / "default_job.args").exists() else None,
              "bench_weights": _load(log / "bench_weights.json"),
              "bench_trainer": _load(log / "bench_trainer.json"),
              "bench_pipeline": _load(log / "bench_pipeline.json")}
    tests = log / "gpu_tests.log"
    if tests.exists():
        lines = [ln for ln in tests.read_text().splitlines() if " passed" in ln or " failed" in ln
                 or " skipped" in ln or "no tests ran" in ln]
        result["gpu_tests"] = lines[-1].strip("= ") if lines else None
    Path(out).write_text(json.dumps(result, indent=1))
    for row in rows(result):
        print(row)
    return 0


def rows(r: dict) -> list[str]:
    """README performance rows (| date | machine | bench | figure |) for what ran."""
    date, machine, out = r["date"], r["machine"], []
    ok = {k: v["rc"] == 0 for k, v in r["steps"].items()}
    if r.get("gpu_tests"):
        out.append(f"| {date} | {machine} | `pytest -m gpu` | {r['gpu_tests']} |")
    job = r.get("default_job")
    if job and ok.get("default-job"):
        out.append(f"| {date} | {machine} | default job, installed from the wheelhouse, torch backends "
                   f"(`{' '.join(r.get('default_job_overrides') or [])}`) "
                   f"| {job['steps']} steps at {job['steps_per_s']:.1f} steps/s; reward {job['reward_first']:.2f}"
                   f" -> {job['reward_last']:.2f}; weight sync {job['weight_sync_s'] * 1e3:.1f} ms (median); "
                   f"head age max {job['age_max']} |")
    w = (r.get("bench_weights") or {}).get("cuda_ipc")
    if w and ok.get("bench-weights"):
        out.append(f"| {date} | {machine} | `bench_weights.py --cuda-params {w['params'] / 1e9:g}e9` (CUDA IPC "
                   f"within one device, random bf16) | reload of {w['bytes'] / 1e9:.1f} GB: {w['reload_ms']:.1f} ms "
                   f"({w['reload_gb_s']:.0f} GB/s) vs a device-to-device copy {w['d2d_ms']:.1f} ms "
                   f"({w['d2d_gb_s']:.0f} GB/s): {w['reload_over_d2d']:.2f}x; publish {w['publish_ms']:.1f} ms |")
    t = r.get("bench_trainer")
    if t and ok.get("bench-trainer"):
        figs = "; ".join(f"{x['ranks']} rank{'s' if x['ranks'] > 1 else ''} {x['split']}: "
                         f"{x['tokens_per_s']:.0f} tokens/s" + (f", MFU {x['mfu']:.1%}" if x["mfu"] else "")
                         for x in t["rows"])
        out.append(f"| {date} | {machine} | `bench_trainer.py --device cuda` (hidden {t['hidden']} x "
                   f"{t['layers']} layers, {t['rows'][0]['params'] / 1e6:.0f}M "
                   f"params, bf16, {t['seqs']} seqs of ~{t['mean_len']} tokens) | {figs} |")
    for p in (r.get("bench_pipeline") or []) if ok.get("bench-pipeline") else []:
        out.append(f"| {date} | {machine} | `bench_pipeline.py --backend torch` on the GPU ({p['steps']} steps, "
                   f"S={p['staleness']}) | async / sync: {p['async_over_sync']:.2f}x ({p['async_steps_per_s']:.2f} "
                   f"vs {p['sync_steps_per_s']:.2f} steps/s); trainer busy {p['async_trainer_busy']:.2f} vs "
                   f"{p['sync_trainer_busy']:.2f}; head age max {p['async_age_max']} |")
    failed = [f"{k} (exit {v['rc']}{', timed out' if v['rc'] in (124, 137) else ''})"
              for k, v in r["steps"].items() if v["rc"] != 0]
    if failed:
        out.append(f"<!-- not in the table: {', '.join(failed)} -->")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"] and len(argv) == 1:
        return probe()
    if argv[:1] == ["deps"] and len(argv) == 2:
        return deps(argv[1])
    if argv[:1] == ["report"] and len(argv) == 4:
        return report(*argv[1:])
    print("usage: gpu_check.py probe | deps SITE | report LOGDIR OUT DATE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
