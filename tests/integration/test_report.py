"""`python -m orchestrator.report`: plots and summary of real runs (the shared session runs, each
resumed once), checked against numbers computed here from their metrics.jsonl; a torn last line;
regressions that must turn a verdict; bad input (exit 2, one line, nothing written)."""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys

import pytest
import yaml

from tests.integration.lifecycle import ROOT, call_main, run

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

STEP_PLOTS = {"reward", "age", "admissions", "out_queue", "parked", "weight_sync", "trainable", "training",
              "pipeline"}


def report(run_dir, out):
    """The tool called in this process (`call_main`); the sim run's report goes through a process."""
    from orchestrator.observe.report import main
    return call_main(main, run_dir, "--out", out)


def report_process(run_dir, out):
    return subprocess.run([sys.executable, "-m", "orchestrator.report", str(run_dir), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def records(run_dir):
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def expected(run_dir):
    """The summary's numbers, computed from the run's own lines."""
    recs = records(run_dir)
    r = yaml.safe_load(open(run_dir / "config.yaml"))["rollout"]
    S = r["max_head_offpolicyness"]
    steps = [x for x in recs if x["kind"] == "step"]
    rewards = [x["reward_mean"] for x in steps if x["reward_mean"] is not None]
    resumes = [x["step"] for x in recs if x["kind"] == "event" and x["event"] == "resume"]
    steady = [x for x in steps if not any(k < x["step"] <= k + S + 2 for k in [0, *resumes])]
    return dict(last_step=max(x["step"] for x in steps), step_lines=len(steps),
                reward_first10=statistics.mean(rewards[:10]), reward_last10=statistics.mean(rewards[-10:]),
                age_max=max(x["age_max"] for x in steps),
                admitted_median=statistics.median(x["admitted"] for x in steady),
                admitted_max=max(x["admitted"] for x in steps)), resumes


@pytest.fixture(scope="module")
def sim_report(sim_run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sim_report") / "report"
    return report_process(sim_run_dir, out), out


@pytest.fixture(scope="module")
def torch_report(torch_run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_report") / "report"
    return report(torch_run_dir, out), out


def check_plots(out, names):
    assert {p.stem for p in out.glob("*.png")} == names
    for p in out.glob("*.png"):
        with Image.open(p) as im:
            im.verify()
        with Image.open(p) as im:
            assert im.format == "PNG" and im.width >= 300 and im.height >= 300, (p, im.size)


def check_summary(run_dir, out, proc):
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout and "| signal |" in proc.stdout
    s = json.loads((out / "summary.json").read_text())
    want, resumes = expected(run_dir)
    for k, v in want.items():
        assert s[k] == pytest.approx(v), k
    assert resumes and [m["step"] for m in s["resumes"]] == resumes
    assert len(s["resumes"]) == 1 and s["restarts"] == []
    md = (out / "summary.md").read_text()
    assert f"resumed at step {resumes[0]}" in md and "| Admissions per step |" in md
    assert len(s["health"]) == 6 and all(r["verdict"] in ("ok", "watch", "n/a") for r in s["health"])
    assert s["steady_steps"] > 0 and all(r["verdict"] != "n/a" for r in s["health"])
    return s


def test_sim_run_report(sim_run_dir, sim_report):
    proc, out = sim_report
    s = check_summary(sim_run_dir, out, proc)
    check_plots(out, STEP_PLOTS)
    assert s["last_eval"] is None and "eval" in s["skipped_plots"]
    assert "eval" in (out / "summary.md").read_text()       # the skipped plot is named


def test_torch_run_report(torch_run_dir, torch_report):
    proc, out = torch_report
    s = check_summary(torch_run_dir, out, proc)
    check_plots(out, STEP_PLOTS | {"eval"})
    last = [x for x in records(torch_run_dir) if x["kind"] == "eval"][-1]
    assert s["last_eval"] == {k: last[k] for k in ("step", "reward_mean", "accuracy")}


def test_multiturn_run_gets_the_episodes_plot(tmp_path):
    pytest.importorskip("torch")
    out = run(tmp_path / "run", "run.total_steps=12", "run.checkpoint_every=0", "eval.every_steps=0",
              "metrics.interval_s=0.1",       # a short run still gets ticks (the pipeline plot)
              "run.progress=false", config="configs/multiturn.yaml", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert report(tmp_path / "run", tmp_path / "rep").returncode == 0
    s = json.load(open(tmp_path / "rep" / "summary.json"))
    assert "episodes" in s["plots"]
    check_plots(tmp_path / "rep", STEP_PLOTS | {"episodes"})


QUEUE, SYNC = "Dispatcher out-queue depth", "Weight-watcher poll to reload latency"


@pytest.mark.parametrize("overrides, slow_stage, watched", [
    (["actor.sim.step_time_s=0.1", "inference.sim.latency_s=0.01"], "the trainer is the bottleneck",
     set()),
    # 16 rollouts in flight: a step every ~0.1 s, so a weight sync slowed by a busy machine stays
    # well under a step (at sim.yaml's 64, steps of ~20 ms made a 3.5 ms sync a stall)
    (["actor.sim.step_time_s=0.01", "inference.sim.latency_s=0.2", "rollout.max_concurrent_rollouts=16"],
     "generation (or the environment)", {QUEUE}),
    (["actor.sim.step_time_s=0.02", "inference.sim.latency_s=0.01", "inference.sim.reload_delay_s=0.1"],
     "the weight sync stalls the version", {QUEUE, SYNC}),
], ids=["slow-trainer", "slow-generation", "slow-weight-sync"])
def test_report_tells_which_stage_is_slow(tmp_path, overrides, slow_stage, watched):
    """Real sim runs, each with one stage made slow: the bottleneck line names that stage and the
    health rows that read `watch` are the ones the seed's table ties to it (a stalled sync starves
    generation too, so the out queue runs empty)."""
    out = run(tmp_path / "run", "run.total_steps=25", "run.checkpoint_every=0", *overrides)
    assert out.returncode == 0, out.stderr[-2000:]
    assert report(tmp_path / "run", tmp_path / "rep").returncode == 0
    s = json.load(open(tmp_path / "rep" / "summary.json"))
    assert s["bottleneck"].startswith(slow_stage), s["bottleneck"]
    assert {h["signal"] for h in s["health"] if h["verdict"] == "watch"} == watched, s["health"]


def copy_run(run_dir, dst):
    dst.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(run_dir / name, dst / name)
    return dst


def test_torn_last_line(sim_run_dir, tmp_path):
    run = copy_run(sim_run_dir, tmp_path / "run")
    step_line = next(line for line in open(run / "metrics.jsonl") if '"kind": "step"' in line)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(step_line[: len(step_line) // 2])
    proc = report(run, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["torn_last_line"] and s["corrupt_lines"] == 0
    assert s["step_lines"] == expected(sim_run_dir)[0]["step_lines"]


def test_regressions_turn_verdicts(sim_run_dir, sim_report, tmp_path):
    """An admissions spike (counters wrong) and a weight sync longer than a step read as watch (the
    unaltered run's admissions read ok); the bottleneck line names the weight sync."""
    run = copy_run(sim_run_dir, tmp_path / "run")
    recs = records(run)
    steps = [x for x in recs if x["kind"] == "step"]
    r = yaml.safe_load(open(run / "config.yaml"))["rollout"]
    steps[-5]["admitted"] = (r["max_head_offpolicyness"] + 1) * r["consumer_batch_size"] + 1
    step_s = statistics.median(b["time"] - a["time"] for a, b in zip(steps, steps[1:]))
    for x in steps:
        x["weight_sync_s"] = 2 * step_s             # a sync longer than a step, every step
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    proc = report(run, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    verdict = {row["signal"]: row["verdict"] for row in s["health"]}
    assert verdict["Admissions per step"] == "watch"
    assert verdict["Weight-watcher poll to reload latency"] == "watch"
    assert s["bottleneck"].startswith("the weight sync")
    clean = {row["signal"]: row["verdict"]
             for row in json.loads((sim_report[1] / "summary.json").read_text())["health"]}
    assert clean["Admissions per step"] == "ok"


@pytest.mark.parametrize("case", ["missing", "no_metrics", "empty_metrics", "no_step_line"])
def test_bad_input_exits_2(case, sim_run_dir, tmp_path):
    run = tmp_path / "run"
    if case != "missing":
        run.mkdir()
        shutil.copy(sim_run_dir / "config.yaml", run / "config.yaml")
    if case == "empty_metrics":
        (run / "metrics.jsonl").write_text("")
    if case == "no_step_line":
        (run / "metrics.jsonl").write_text('{"kind": "tick", "time": 1.0}\n{"kind": "st')
    out = tmp_path / "out"
    proc = report(run, out)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(run) in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists() and proc.stdout == ""
