"""Async vs synchronous RL loop, measured in one run: steps/s and trainer busy fraction.

    python scripts/bench_pipeline.py [--steps 40] [--latency 0.05] [--step-time 0.05] [--backend sim]
    python scripts/bench_pipeline.py --backend multiturn [--tool-latency 0.05] [--tool-sigma 1.0]
    python scripts/bench_pipeline.py --backend agent [--steps 40] [--rounds 5]
    python scripts/bench_pipeline.py --sigma 1.5 --bound 3       # a long tail, with the hard bound
    python scripts/bench_pipeline.py --backend torch --json out.json "inference.devices=['0']"

Runs the real supervisor twice per round, alternating: `max_head_offpolicyness=0` (the synchronous
baseline: generation and training take turns) and `max_head_offpolicyness=S` (asynchronous), with
the same rollout latency and trainer step time, and prints the median throughput ratio with the
observed ages. With the `sim` backends the work is sleeps, so the ratio measures the orchestration
(overlap, gate, ship hold, weight sync), not compute. `--backend torch` runs the default job's model.
`--backend multiturn` runs the multi-turn tool job (configs/multiturn.yaml: the tiny model, the
`lookup` environment) with a long-tailed tool latency (lognormal, mean `--tool-latency`, sigma
`--tool-sigma`): episodes of two model turns around a tool call whose wait varies per episode.
`--backend agent` runs that job's `lookup` task twice per round, its episodes played in process and
by the built-in agent over the inference worker's HTTP endpoint (`task.agent`:
orchestrator/envs/agent_lookup.py, an AsyncOpenAI client), both asynchronous (S=`--staleness`)
without tool latency, and prints episodes/s of each and the ratio agent / in-process (median of the
per-round ratios, with their min-max): the cost of the HTTP path on the same task.
`--sigma X` makes the sim rollout latency lognormal (mean `--latency`, sigma X: a long tail; a
comma list runs one table per sigma). With the sim backend every table also prints the throughput
of a zero-overhead event model of the same workload driving the real gate (scripts/event_model.py)
and the ratio async / ideal, per round and as a median (`--rounds`, default 5). Round k runs with
`run.seed=k` in every mode, and its event model with the same seed: the sim backend draws a
request's latency from the run seed and the request id alone, so the model replays the run's
admissions with their very latencies and the per-round ratio measures the orchestration only.
Every table but the multi-turn one also runs `run.deterministic=true` at the same S (the row
`determ.`: waves at the schedule's versions, `loop.lockstep`) and prints its throughput against
free async (the median of the per-round ratios and their spread).
`--bound M` adds a third mode, the same S with the hard age bound
`rollout.max_observed_offpolicyness=M`, and prints its throughput against the gate alone with the
rollouts it aborted in flight, the finished ones it dropped and the tokens they wasted.
Trailing `key=value` arguments are config overrides for every run (a GPU: `inference.devices=['0']`);
`--json OUT` writes each table's medians to OUT (scripts/gpu_check.sh reads it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


AGENT = "orchestrator.envs.agent_lookup:run"     # the built-in lookup task played over HTTP


def run_once(S: int, args, run_dir: str, bound=None, seed: int = 0, agent: bool = False,
             det: bool = False) -> dict:
    if args.backend == "sim":
        cfg = "configs/sim.yaml"
        extra = [f"inference.sim.latency_s={args.latency}", f"actor.sim.step_time_s={args.step_time}"]
        if args.sigma is not None:
            extra += ["inference.sim.latency=lognormal", f"inference.sim.lognormal_sigma={args.sigma}"]
    elif args.backend == "multiturn":
        cfg = "configs/multiturn.yaml"
        extra = ["eval.every_steps=0", "run.checkpoint_every=0",
                 f"task.env_args={{latency_s: {args.tool_latency}, latency_sigma: {args.tool_sigma}}}"]
    elif args.backend == "agent":                  # the same job and task, no tool latency in either
        cfg = "configs/multiturn.yaml"
        extra = ["eval.every_steps=0", "run.checkpoint_every=0", "task.env_args={latency_s: 0.0}"]
        if agent:
            extra.append(f"task.agent={AGENT}")
    else:
        cfg = "configs/default.yaml"
        extra = ["eval.every_steps=0", "run.checkpoint_every=0"]
    cmd = [sys.executable, "-m", "orchestrator.launch", "--config", cfg, f"run.dir={run_dir}",
           "run.resume=never", "run.progress=false", f"run.total_steps={args.steps}", f"run.seed={seed}",
           f"rollout.max_head_offpolicyness={S}", *extra, *args.overrides]
    if bound is not None:
        cmd.append(f"rollout.max_observed_offpolicyness={bound}")
    if det:
        cmd.append("run.deterministic=true")
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"run failed (S={S}): {out.stderr.strip().splitlines()[-1]}")
    steps = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in steps if r["kind"] == "step"]
    warm = steps[len(steps) // 4:]                   # skip the fill-up
    span = warm[-1]["time"] - warm[0]["time"]
    train = sum(r["train_s"] for r in warm[1:])
    episodes = sum(r["trainable"] + r.get("rollouts_rejected", 0) for r in warm[1:])
    return {"steps_per_s": (len(warm) - 1) / span, "trainer_busy": train / span,
            "episodes_per_s": episodes / span,
            "age_max": max(r["age_max"] for r in steps), "age_p99": max(r["age_p99"] for r in steps),
            "age_mean": statistics.mean(r["age_mean"] for r in steps),
            **{k: sum(r.get(k, 0) for r in steps) for k in ("aborted", "dropped", "wasted_tokens")}}


def ideal(S: int, args, sigma) -> list[float]:
    """Steps/s of the zero-overhead event model (scripts/event_model.py) with the sim workload's
    gate settings, latency and step time: one value per round, seeded as that round's runs are
    (`run.seed`), so it replays the very latencies the sim workers drew."""
    import yaml
    from scripts.event_model import simulate
    r = yaml.safe_load(open(ROOT / "configs" / "sim.yaml"))["rollout"]
    return [simulate(S, r["consumer_batch_size"], r["max_concurrent_rollouts"], args.latency, sigma,
                     args.step_time, args.steps, seed=k).steps_per_s() for k in range(args.rounds)]


def block(args, sigma) -> dict:
    """Every mode, interleaved over rounds, on one workload; prints its table and ratios, returns
    their medians."""
    args = argparse.Namespace(**{**vars(args), "sigma": sigma})
    S = args.staleness
    modes = {"sync": (0, None), "async": (S, None)}
    if args.bound is not None:
        modes["bound"] = (S, args.bound)
    if args.backend != "multiturn":       # run.deterministic refuses multi-turn environments
        modes["det"] = (S, None)
    res = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):                 # interleaved: noise hits every mode alike
            for m, (s, bound) in modes.items():
                res[m].append(run_once(s, args, os.path.join(tmp, f"{m}_{r}"), bound, seed=r,
                                       det=m == "det"))
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    ratio = med(res["async"], "steps_per_s") / med(res["sync"], "steps_per_s")
    ideals = {m: ideal(s, args, sigma) for m, (s, bound) in modes.items()
              if args.backend == "sim" and bound is None and m != "det"}
    workload = (f"tool latency {args.tool_latency}s, sigma {args.tool_sigma}" if args.backend == "multiturn"
                else f"latency {args.latency}s{f' lognormal sigma {sigma}' if sigma else ''}, "
                     f"step {args.step_time}s")
    print(f"bench_pipeline: backend {args.backend}, {args.steps} steps x {args.rounds} rounds, {workload}")
    print(f"{'mode':14s} {'steps/s':>9s} {'(min-max)':>13s} {'ideal':>6s} {'trainer busy':>13s} "
          f"{'age max':>8s} {'age p99':>8s} {'age mean':>9s} {'aborted':>8s} {'dropped':>8s} "
          f"{'wasted tok':>11s}")
    names = {"sync": "sync (S=0)", "async": f"async (S={S})", "bound": f"bound (M={args.bound})",
             "det": f"determ. (S={S})"}
    for m, xs in res.items():
        rates = [x["steps_per_s"] for x in xs]
        best = f"{statistics.median(ideals[m]):6.2f}" if m in ideals else f"{'-':>6s}"
        print(f"{names[m]:14s} {med(xs, 'steps_per_s'):9.2f} {f'({min(rates):.2f}-{max(rates):.2f})':>13s} "
              f"{best} {med(xs, 'trainer_busy'):13.2f} {max(x['age_max'] for x in xs):8d} "
              f"{max(x['age_p99'] for x in xs):8.1f} {med(xs, 'age_mean'):9.2f} "
              f"{med(xs, 'aborted'):8.0f} {med(xs, 'dropped'):8.0f} {med(xs, 'wasted_tokens'):11.0f}")
    print(f"async / sync throughput: {ratio:.2f}x (median of {args.rounds} rounds)")
    if ideals:
        spread = [x["steps_per_s"] / i for x, i in zip(res["async"], ideals["async"])]
        print(f"async / ideal event model: {med(res['async'], 'steps_per_s') / statistics.median(ideals['async']):.2f} "
              f"(per round {min(spread):.2f}-{max(spread):.2f})")
    if "bound" in res:
        b = med(res["bound"], "steps_per_s") / med(res["async"], "steps_per_s")
        print(f"bound / gate alone throughput: {b:.2f}x (median of {args.rounds} rounds)")
    if "det" in res:
        per = [d["steps_per_s"] / a["steps_per_s"] for d, a in zip(res["det"], res["async"])]
        print(f"deterministic / free async throughput: {statistics.median(per):.2f}x (median of "
              f"{args.rounds} rounds, per round {min(per):.2f}-{max(per):.2f})")
    return {"backend": args.backend, "sigma": sigma, "steps": args.steps, "rounds": args.rounds,
            "staleness": S, "overrides": list(args.overrides), "async_over_sync": ratio,
            **({"det_over_async": statistics.median(d["steps_per_s"] / a["steps_per_s"]
                                                    for d, a in zip(res["det"], res["async"]))}
               if "det" in res else {}),
            **{f"{m}_{k}": med(xs, k) for m, xs in res.items()
               for k in ("steps_per_s", "trainer_busy", "age_mean")},
            **{f"{m}_age_max": max(x["age_max"] for x in xs) for m, xs in res.items()}}


def agent_block(args) -> dict:
    """`--backend agent`: the lookup job with its episodes played in process (`task.name: lookup`)
    and by the built-in agent over the worker's HTTP endpoint (`task.agent`, envs/agent_lookup.py),
    both at S=`--staleness`, interleaved over rounds with one seed per round; prints episodes/s of
    each and the ratio agent / in-process: the median of the per-round ratios and their spread."""
    S = args.staleness
    res: dict = {"env": [], "agent": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for m in res:
                res[m].append(run_once(S, args, os.path.join(tmp, f"{m}_{r}"), seed=r, agent=m == "agent"))
    ratios = [a["episodes_per_s"] / e["episodes_per_s"] for a, e in zip(res["agent"], res["env"])]
    print(f"bench_pipeline: backend agent (the lookup job, S={S}), {args.steps} steps x {args.rounds} rounds")
    print(f"{'mode':14s} {'episodes/s':>11s} {'(min-max)':>15s} {'steps/s':>8s} {'trainer busy':>13s} {'age max':>8s}")
    names = {"env": "in-process", "agent": "agent (HTTP)"}
    for m, xs in res.items():
        eps = [x["episodes_per_s"] for x in xs]
        print(f"{names[m]:14s} {statistics.median(eps):11.1f} {f'({min(eps):.1f}-{max(eps):.1f})':>15s} "
              f"{statistics.median(x['steps_per_s'] for x in xs):8.2f} "
              f"{statistics.median(x['trainer_busy'] for x in xs):13.2f} {max(x['age_max'] for x in xs):8d}")
    ratio = statistics.median(ratios)
    print(f"agent / in-process episodes/s: {ratio:.3f}x (median of {args.rounds} rounds, "
          f"per round {min(ratios):.3f}-{max(ratios):.3f})")
    return {"backend": "agent", "steps": args.steps, "rounds": args.rounds, "staleness": S,
            "overrides": list(args.overrides), "agent_over_env": ratio, "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            **{f"{m}_{k}": statistics.median(x[k] for x in xs) for m, xs in res.items()
               for k in ("episodes_per_s", "steps_per_s", "trainer_busy")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--latency", type=float, default=0.05, help="sim rollout latency (s)")
    ap.add_argument("--step-time", type=float, default=0.05, help="sim trainer step time (s)")
    ap.add_argument("--backend", choices=["sim", "torch", "multiturn", "agent"], default="sim")
    ap.add_argument("--tool-latency", type=float, default=0.05, help="multiturn: mean tool latency (s)")
    ap.add_argument("--tool-sigma", type=float, default=1.0, help="multiturn: lognormal sigma of it")
    ap.add_argument("--sigma", default=None, help="sim: lognormal rollout latency sigma; a comma "
                    "list (0.5,1.0,1.5) runs one table per value")
    ap.add_argument("--bound", type=int, default=None, help="also run the hard age bound M")
    ap.add_argument("--json", default=None, metavar="OUT", help="write every table's medians to OUT")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every run")
    args = ap.parse_args(argv)
    if args.backend == "agent":
        table = agent_block(args)
        if args.json:
            Path(args.json).write_text(json.dumps([table], indent=1))
        return 0
    tables = [block(args, sigma) for sigma in ([float(x) for x in args.sigma.split(",")] if args.sigma
                                                else [None])]
    if args.json:
        Path(args.json).write_text(json.dumps(tables, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
