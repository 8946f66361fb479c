"""`python -m orchestrator.report RUN_DIR [--out DIR]`: plots and a health summary of a run directory.

Reads RUN_DIR/config.yaml (S = rollout.max_head_offpolicyness, B = rollout.consumer_batch_size,
G = rollout.group_size) and RUN_DIR/metrics.jsonl (a run may still be going or have crashed: a torn
last line is ignored, a corrupt line elsewhere is skipped and counted). Writes to DIR (default
RUN_DIR/report/) one PNG per signal that has data (reward, eval, age, admissions, out_queue, parked,
weight_sync, trainable, training, episodes (multi-turn: environment vs generation seconds per
episode, turns, tool calls, limited and rejected episodes), sources (a `task.datasets` mixture:
`reward_mean/<name>` of step and eval lines), pipeline; resumes and worker restarts
are vertical lines on each), `summary.md` and `summary.json` (the same numbers), then prints DIR and the summary. Exit codes: 0
written; 2 bad input (no such dir, no config.yaml, no metrics.jsonl or no step line in it, matplotlib
missing), one line on stderr, nothing written.

Health table (the seed's pipeline signals), judged on steady-state steps: every step line except the
first S+2 steps of each launch (steps k+1..k+S+2 after the start k=0 and after each resume at k).
Quarter medians (q1, q4) are the medians of the first and last quarter of those steps; "step" is the
median time between consecutive step lines (a resume gap excluded). Verdicts are ok / watch / n/a:
- out-queue depth: watch if q4 - q1 >= B (growing: the trainer is the bottleneck), or if the median
  is 0 while parked_s median < PARKED_FRAC*step (empty and batches ship at once: generation is the
  bottleneck); empty with batches parked for the trainer is ok (finished work waits in the ship hold).
- admissions per step: watch if the steady median is 0 (the gate is closed) or any step, resumed
  ones included, admitted more than (S+1)*B (a spike: the counters are wrong). In steady state the
  gate re-admits what a step consumed (B); (S+1)*B is the most one step may admit.
- head age: watch if the steady age_max exceeds S + max(1, ceil(S/2)) (a large gap: completion-time
  spread, not a config error).
- weight sync: watch if the median exceeds SYNC_FRAC*step, or if q4 > 2*q1 and q4 > SYNC_FRAC*step
  (not well under a step, or growing: that stalls the version and therefore the gate).
- trainable fraction (trainable / (B*G)): watch if q4 < q1/2 or q4 = 0 (trending to zero: a broken
  environment or reward).
- parked time: watch if q4 > 2*q1 and q4 - q1 > PARKED_FRAC*step (growing: generation runs ahead of
  what the bound permits).
Bottleneck line, first rule that holds: sync watch -> the weight sync stalls the version; out queue
growing or parked_s median >= PARKED_FRAC*step -> the trainer; out queue empty -> generation (or the
environment); else no single stage.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Optional

import yaml

from orchestrator.run.audit import read_metrics

TRAINING = ("loss", "train_clip_frac", "train_approx_kl", "train_imp_weight_mean", "train_ratio_mean",
            ("logprob_diff_mean", "logprob_diff_max"))
TICKS = ("in_queue", "out_queue", "inflight", "parked", "lag")
SYNC_FRAC = 0.25      # weight sync median above this share of a step: watch
PARKED_FRAC = 0.25    # parked median at least this share of a step: batches wait for the trainer
FEW = "too few steps (steady state starts after S+2 steps of each launch)"
MARK_STYLE = {"resume": dict(color="0.35", ls="--"), "restart": dict(color="tab:red", ls=":")}


class ReportError(ValueError):
    pass


def num(x) -> Optional[float]:
    """A finite number, else None (JSON null, bools and strings are not numbers here)."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def med(xs: list) -> Optional[float]:
    return statistics.median(xs) if xs else None


def quarters(xs: list) -> tuple[Optional[float], Optional[float]]:
    q = max(1, len(xs) // 4)
    return med(xs[:q]), med(xs[-q:])


def series(recs: list[dict], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    pts = [(num(r.get(x)), num(r.get(key))) for r in recs]
    pts = [p for p in pts if p[0] is not None and p[1] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def gapped(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """Break a time series (NaN) across gaps over 3x its median interval, e.g. between launches."""
    limit = 3 * (med([b - a for a, b in zip(xs, xs[1:])]) or 0.0)
    for i in reversed([i for i in range(1, len(xs)) if xs[i] - xs[i - 1] > limit]):
        xs, ys = xs[:i] + [xs[i]] + xs[i:], ys[:i] + [math.nan] + ys[i:]
    return xs, ys


def load(run_dir: str) -> dict:
    """The run's records and config, or ReportError naming the missing piece."""
    if not os.path.isdir(run_dir):
        raise ReportError(f"run dir {run_dir} does not exist")
    cfg_path, metrics_path = os.path.join(run_dir, "config.yaml"), os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics_path):
        raise ReportError(f"{metrics_path} does not exist")
    try:
        cfg = yaml.safe_load(open(cfg_path))
        r = cfg["rollout"]
        S, B, G = int(r["max_head_offpolicyness"]), int(r["consumer_batch_size"]), int(r.get("group_size", 1))
    except FileNotFoundError:
        raise ReportError(f"{cfg_path} does not exist (not a run directory)") from None
    except (yaml.YAMLError, TypeError, KeyError, ValueError) as exc:
        raise ReportError(f"{cfg_path}: no rollout.max_head_offpolicyness/consumer_batch_size "
                          f"({type(exc).__name__}: {exc})".replace("\n", " ")) from None
    recs, bad, nlines = read_metrics(run_dir)
    of = lambda kind: [x for x in recs if x.get("kind") == kind]
    steps = [x for x in of("step") if num(x.get("step")) is not None]
    if not steps:
        raise ReportError(f"{metrics_path} has no step line")
    times = [t for t in (num(x.get("time")) for x in recs) if t is not None]
    total = (cfg.get("run") or {}).get("total_steps")
    return dict(run_dir=run_dir, S=S, B=B, G=G, total=total, steps=steps, ticks=of("tick"),
                evals=of("eval"), events=of("event"), t0=min(times, default=0.0),
                t1=max(times, default=0.0), torn_last=nlines - 1 in bad,
                corrupt=len([i for i in bad if i != nlines - 1]))


def marks(run: dict) -> list[dict]:
    """Resumes (at the step resumed from) and worker restarts (at the step in progress then)."""
    out, seen = [], set()
    for e in run["events"]:
        if e.get("event") == "resume" and num(e.get("step")) is not None:
            seen.add(int(e["step"]))
            out.append(dict(kind="resume", step=int(e["step"]), time=num(e.get("time"))))
    for s in run["steps"]:
        if s.get("resumed") is True and int(s["step"]) - 1 not in seen:
            seen.add(int(s["step"]) - 1)
            out.append(dict(kind="resume", step=int(s["step"]) - 1, time=num(s.get("time"))))
    for e in run["events"]:
        if e.get("event") == "worker_restart":
            t = num(e.get("time"))
            done = [int(s["step"]) for s in run["steps"] if t is not None and (num(s.get("time")) or 0) <= t]
            out.append(dict(kind="restart", step=(done[-1] if done else 0) + 1, time=t,
                            worker=e.get("worker")))
    return out


def fmt(x, unit: str = "") -> str:
    return "n/a" if x is None else (f"{x:.3g}{unit}" if isinstance(x, float) else f"{x}{unit}")


def health(run: dict, st: list[dict], step_s: Optional[float]) -> tuple[list[dict], str]:
    """(one row per seed signal, the bottleneck line); the rules are in the module docstring."""
    S, B, G, bound = run["S"], run["B"], run["G"], (run["S"] + 1) * run["B"]
    col = lambda recs, k: series(recs, k)[1]
    rows: list[dict] = []

    def row(signal, healthy, value, needed, rules, **numbers):
        """rules: (condition, verdict, reason), the first that holds; n/a while a number is absent."""
        v, why = ("n/a", FEW) if any(x is None for x in needed) else \
            next((v, why) for cond, v, why in rules if cond())
        rows.append(dict(signal=signal, value=value, healthy=healthy, verdict=v, reason=why, numbers=numbers))
        return v

    oq, parked, sync = col(st, "out_queue_depth"), col(st, "parked_s"), col(st, "weight_sync_s")
    (oq_med, (oq1, oq4)), (pk_med, (pk1, pk4)) = (med(oq), quarters(oq)), (med(parked), quarters(parked))
    ref = step_s or 0.0
    waits = pk_med is not None and pk_med >= PARKED_FRAC * ref
    growing = oq1 is not None and oq4 - oq1 >= B
    row("Dispatcher out-queue depth", "non-empty, stable",
        f"median {fmt(oq_med)}, q1 {fmt(oq1)} -> q4 {fmt(oq4)}", [oq_med],
        [(lambda: growing, "watch", "growing: the trainer is the bottleneck"),
         (lambda: oq_med == 0 and not waits, "watch",
          "empty and batches ship at once: generation is the bottleneck"),
         (lambda: oq_med == 0, "ok", "empty, but built batches wait parked for the trainer"),
         (lambda: True, "ok", "non-empty, stable")], median=oq_med, q1=oq1, q4=oq4)

    adm_med, adm_max = med(col(st, "admitted")), max(col(run["steps"], "admitted"), default=None)
    spike = adm_max is not None and adm_max > bound
    row("Admissions per step", "near `(S + 1) * B` at steady state",
        f"median {fmt(adm_med)} (B={B}), max {fmt(adm_max)} vs (S+1)*B={bound}", [] if spike else [adm_med],
        [(lambda: spike, "watch", f"a spike above (S+1)*B={bound}: the counters are wrong"),
         (lambda: adm_med == 0, "watch", "zero: the gate is closed"),
         (lambda: True, "ok", f"steady median re-admits a step's batch (B={B}), max within (S+1)*B")],
        median=adm_med, max=adm_max, bound=bound)

    amax, ap99 = max(col(st, "age_max"), default=None), max(col(st, "age_p99"), default=None)
    limit = S + max(1, math.ceil(S / 2))
    row("Observed head off-policy age (max, p99)", "at or slightly above `S`",
        f"max {fmt(amax)}, p99 {fmt(ap99)} vs S={S}", [amax],
        [(lambda: amax > limit, "watch",
          f"max above {limit}: a large gap means completion-time spread, not a config error"),
         (lambda: amax >= S, "ok", "at or slightly above S"),
         (lambda: True, "ok", "below S: the bound does not bind")], max=amax, p99=ap99, S=S, limit=limit)

    sy_med, sy_max, (sy1, sy4) = med(sync), max(sync, default=None), quarters(sync)
    sync_watch = "watch" == row(
        "Weight-watcher poll to reload latency", "bounded, well under a step",
        f"median {fmt(sy_med, ' s')}, max {fmt(sy_max, ' s')}, q1 {fmt(sy1, ' s')} -> "
        f"q4 {fmt(sy4, ' s')} vs step {fmt(step_s, ' s')}", [sy_med, step_s],
        [(lambda: sy_med > SYNC_FRAC * ref, "watch",
          "not well under a step: it stalls the version and therefore the gate"),
         (lambda: sy4 > 2 * sy1 and sy4 > SYNC_FRAC * ref, "watch",
          "growing: a growing value stalls the version and therefore the gate"),
         (lambda: True, "ok", "bounded, well under a step")],
        median=sy_med, max=sy_max, q1=sy1, q4=sy4, step_s=step_s)

    f1, f4 = quarters([t / (B * G) for t in col(st, "trainable")])
    row("Trainable samples per batch after filtering", "stable fraction",
        f"q1 {fmt(f1)} -> q4 {fmt(f4)} of B*G={B * G}", [f1],
        [(lambda: f4 < f1 / 2 or f4 == 0, "watch", "trending to zero: a broken environment or reward"),
         (lambda: True, "ok", "stable fraction")], q1=f1, q4=f4)

    row("Time parked waiting for the trainer", "small and steady",
        f"median {fmt(pk_med, ' s')}, q1 {fmt(pk1, ' s')} -> q4 {fmt(pk4, ' s')}", [pk_med],
        [(lambda: pk4 > 2 * pk1 and pk4 - pk1 > PARKED_FRAC * ref, "watch",
          "growing: generation is running ahead of what the bound permits"),
         (lambda: True, "ok", "steady")], median=pk_med, q1=pk1, q4=pk4)

    if oq_med is None or step_s is None:
        neck = f"cannot tell the bottleneck: {FEW}"
    elif sync_watch:
        neck = (f"the weight sync stalls the version (median {fmt(sy_med, ' s')} of a "
                f"{fmt(step_s, ' s')} step)")
    elif growing or waits:
        neck = (f"the trainer is the bottleneck: built batches wait parked for it (median "
                f"{fmt(pk_med, ' s')} of a {fmt(step_s, ' s')} step)")
    elif oq_med == 0:
        neck = "generation (or the environment) is the bottleneck: the out queue is empty and batches " \
               "ship as soon as built"
    else:
        neck = "no single stage binds: the out queue holds work and batches barely wait"
    return rows, neck


def summarize(run: dict, out: str) -> dict:
    ms, steps = marks(run), run["steps"]
    starts = [0, *(m["step"] for m in ms if m["kind"] == "resume")]     # steady: past each launch's S+2
    st = [s for s in steps if not any(k < s["step"] <= k + run["S"] + 2 for k in starts)]
    step_s = med([b["time"] - a["time"] for a, b in zip(steps, steps[1:]) if b["step"] == a["step"] + 1
                  and not b.get("resumed") and None not in (num(a.get("time")), num(b.get("time")))])
    rows, neck = health(run, st, step_s)
    rewards = series(steps, "reward_mean")[1]
    mean = lambda xs: statistics.fmean(xs) if xs else None
    ev = run["evals"][-1] if run["evals"] else None
    nums = [int(s["step"]) for s in steps]
    return dict(
        run_dir=run["run_dir"], out_dir=out, S=run["S"], B=run["B"], group_size=run["G"],
        first_step=nums[0], last_step=max(nums), step_lines=len(nums), total_steps=run["total"],
        finished=run["total"] is not None and max(nums) >= run["total"], steady_steps=len(st),
        wall_s=run["t1"] - run["t0"], step_s=step_s,
        reward_first10=mean(rewards[:10]), reward_last10=mean(rewards[-10:]),
        last_eval=None if ev is None else {k: ev.get(k) for k in ("step", "reward_mean", "accuracy")},
        age_max=max(series(steps, "age_max")[1], default=None),
        age_p99_max=max(series(steps, "age_p99")[1], default=None),
        admitted_median=rows[1]["numbers"]["median"], admitted_max=rows[1]["numbers"]["max"],
        resumes=[m for m in ms if m["kind"] == "resume"], restarts=[m for m in ms if m["kind"] == "restart"],
        torn_last_line=run["torn_last"], corrupt_lines=run["corrupt"], health=rows, bottleneck=neck)


def markdown(s: dict) -> str:
    ev = s["last_eval"]
    lines = [
        f"# Run report: {s['run_dir']}", "",
        f"- steps: {s['first_step']}..{s['last_step']} ({s['step_lines']} step lines; target "
        f"{s['total_steps']}, {'finished' if s['finished'] else 'not finished: running or stopped'})",
        f"- wall time: {fmt(s['wall_s'], ' s')}; median step {fmt(s['step_s'], ' s')}",
        f"- reward: {fmt(s['reward_first10'])} (first 10 steps) -> {fmt(s['reward_last10'])} (last 10)",
        "- last eval: " + ("none" if ev is None else f"step {ev['step']}, reward "
                           f"{fmt(num(ev['reward_mean']))}, accuracy {fmt(num(ev['accuracy']))}"),
        f"- restarts: {len(s['restarts'])}" + "".join(f"; worker {m.get('worker')} during step {m['step']}"
                                                      for m in s["restarts"]),
        f"- resumes: {len(s['resumes'])}" + "".join(f"; resumed at step {m['step']}" for m in s["resumes"]),
        f"- metrics.jsonl: {s['corrupt_lines']} corrupt lines skipped"
        + ("; torn last line ignored" if s["torn_last_line"] else ""),
        f"- plots: {', '.join(s['plots']) or 'none'}"
        + "".join(f"; skipped {k} ({why})" for k, why in s["skipped_plots"].items()),
        "", f"## Health ({s['steady_steps']} steady-state steps, S={s['S']}, B={s['B']}, "
        f"group_size={s['group_size']})", "",
        "| signal | value | reads as healthy | verdict |", "|---|---|---|---|"]
    lines += [f"| {r['signal']} | {r['value']} | {r['healthy']} | {r['verdict']}: {r['reason']} |"
              for r in s["health"]]
    return "\n".join(lines + ["", f"**Bottleneck:** {s['bottleneck']}", ""])


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ReportError("matplotlib is not installed: pip install matplotlib "
                          "(or the project's `report` extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plots(run: dict, ms: list[dict], out: str) -> tuple[list[str], dict]:
    """Write the PNGs; returns (names written, {name: why skipped})."""
    plt = pyplot()
    S, B, G, st, ev, t0 = run["S"], run["B"], run["G"], run["steps"], run["evals"], run["t0"]
    done, skipped = [], {}

    def timed(recs: list[dict], key: str) -> tuple[list[float], list[float]]:
        xs, ys = series(recs, key, x="time")
        return gapped([x - t0 for x in xs], ys)

    def panel(ylabel, curves, hlines=(), time_axis=False):
        return ylabel, [c for c in curves if c[1][0]], hlines, time_axis

    def figure(name, title, panels, why="no data in the step lines"):
        """panels: (ylabel, [(label, (xs, ys), style)], [(label, y) horizontal lines], time axis)."""
        panels = [p for p in panels if p[1]]
        if not panels:
            skipped[name] = why
            return
        cols = 2 if len(panels) > 2 else 1
        rows = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols + 3 * (cols == 1), 2.8 * rows + 1.7),
                                 squeeze=False)
        for ax, (ylabel, curves, hlines, time_axis) in zip(axes.flat, panels):
            for label, (xs, ys), style in curves:
                ax.plot(xs, ys, style, label=label, ms=4)
            for label, y in hlines:
                ax.axhline(y, color="k", lw=1, ls="-.", label=label)
            labelled = set()
            for m in ms:
                x = (m["time"] - t0 if m["time"] is not None else None) if time_axis else m["step"]
                if x is not None:
                    ax.axvline(x, lw=1, label=None if m["kind"] in labelled else m["kind"],
                               **MARK_STYLE[m["kind"]])
                    labelled.add(m["kind"])
            ax.set_xlabel("wall time (s)" if time_axis else "step")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"{name}.png"), dpi=100)
        plt.close(fig)
        done.append(name)

    line = lambda recs, *keys: [(k, series(recs, k), "-") for k in keys]
    figure("reward", "reward", [panel("reward", line(st, "reward_mean") + [
        ("eval reward_mean", series(ev, "reward_mean"), "o"),
        ("eval accuracy", series(ev, "accuracy"), "s")])])
    figure("eval", "eval", [panel("eval", [("reward_mean", series(ev, "reward_mean"), "o-"),
                                           ("accuracy", series(ev, "accuracy"), "s-")])], why="no eval lines")
    figure("age", "observed head off-policy age", [
        panel("age (versions)", line(st, "age_max", "age_p99", "age_mean"), [(f"S={S}", S)])])
    figure("admissions", "admissions per step", [
        panel("admitted", line(st, "admitted"), [(f"(S+1)*B={(S + 1) * B}", (S + 1) * B)])])
    figure("out_queue", "dispatcher out-queue depth", [
        panel("groups", line(st, "out_queue_depth")),
        panel("groups", [("tick out_queue", timed(run["ticks"], "out_queue"), "-")], time_axis=True)])
    figure("parked", "time parked waiting for the trainer", [panel("s", line(st, "parked_s"))])
    figure("weight_sync", "weight-sync latency", [panel("s", line(st, "weight_sync_s", "train_s"))])
    xs, ys = series(st, "trainable")
    figure("trainable", "trainable fraction", [
        panel(f"trainable / (B*G={B * G})", [("trainable fraction", (xs, [y / (B * G) for y in ys]), "-")])])
    figure("training", "training internals",
           [panel("", line(st, *((k,) if isinstance(k, str) else k))) for k in TRAINING],
           why="no training statistics in the step lines")
    figure("episodes", "multi-turn episodes: environment vs generation time per episode", [
        panel("s per episode", line(st, "env_s_mean", "gen_s_mean")),
        panel("turns", line(st, "turns_mean", "turns_max")),
        panel("per step", line(st, "tool_calls", "episodes_limited", "rollouts_rejected"))],
        why="no multi-turn episode fields (a single-turn task)")
    per = lambda recs: sorted({k for r in recs for k in r if k.startswith("reward_mean/")})
    figure("sources", "reward per dataset source (task.datasets)", [
        panel("train reward", line(st, *per(st))),
        panel("eval reward", [(k, series(ev, k), "o-") for k in per(ev)])],
        why="no per-source reward fields (not a mixture)")
    figure("pipeline", "pipeline over time (tick lines)",
           [panel("count", [(k, timed(run["ticks"], k), "-") for k in TICKS], time_axis=True)],
           why="no tick lines")
    return done, skipped


def report(run_dir: str, out: Optional[str] = None) -> dict:
    """Read the run, write the plots and summaries to `out` (default RUN_DIR/report); the summary."""
    run = load(run_dir)
    out = out or os.path.join(run_dir, "report")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ReportError(f"{out} exists and is not a directory")
    pyplot()                                    # fail before anything is written
    summary = summarize(run, out)
    os.makedirs(out, exist_ok=True)
    summary["plots"], summary["skipped_plots"] = plots(run, summary["resumes"] + summary["restarts"], out)
    for name in summary["skipped_plots"]:       # no stale plot from an earlier report
        if os.path.exists(p := os.path.join(out, f"{name}.png")):
            os.remove(p)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(markdown(summary))
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.report", description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="output directory (default: RUN_DIR/report)")
    args = p.parse_args(argv)
    try:
        summary = report(args.run_dir, args.out)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {summary['out_dir']}\n")
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
