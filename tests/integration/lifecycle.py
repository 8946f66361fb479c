"""Helpers for the lifecycle-failure tests: start a sim run, wait for progress, find workers."""
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from orchestrator.runtime.forkserver import TORCH

ROOT = Path(__file__).resolve().parents[2]


def start(run_dir, *overrides, config="configs/sim.yaml", env=None):
    """A launch in the background; `env`: variables added to this process's environment."""
    return subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config", config,
                             f"run.dir={run_dir}", *overrides], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(env))


def _env(extra):
    return None if extra is None else {**os.environ, **extra}


def steps(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec["kind"] == "step":
            out.append(rec)
    return out


def wait_for_step(proc, run_dir, step, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run exited early ({proc.returncode}): {proc.stderr.read()}")
        s = steps(run_dir)
        if s and s[-1]["step"] >= step:
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def worker_pids(run_dir):
    return json.load(open(os.path.join(run_dir, "logs", "pids.json")))


def descendants(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def all_gone(procs, timeout):
    gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def run_segments(*procs):
    """/dev/shm entries of the runs whose supervisors are `procs` (run ids start with the pid)."""
    prefixes = tuple(f"arl_{p.pid}-" for p in procs)
    return sorted(n for n in os.listdir("/dev/shm")
                  if n.removeprefix("sem.").startswith(prefixes))


def run(run_dir, *overrides, config="configs/sim.yaml", timeout=120, env=None):
    """Run a launch to its end: CompletedProcess with text stdout/stderr."""
    return subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config", config,
                           f"run.dir={run_dir}", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=_env(env))


def events(run_dir, name=None):
    out = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:        # a killed run's last line may be cut
            continue
        if rec["kind"] == "event" and (name is None or rec["event"] == name):
            out.append(rec)
    return out


def trained_prompt_ids(run_dir, total_steps):
    """Prompt ids of every sample in the persisted batches of steps 1..total_steps."""
    from orchestrator.run.durable import read_record
    from shm.codec import decode
    ids = []
    for step in range(1, total_steps + 1):
        batch = decode(read_record(os.path.join(run_dir, "batches", f"step_{step:08d}.rec")))
        assert batch.ident == step and batch.version == step - 1
        ids.extend(batch.prompt_ids.tolist())
    return sorted(ids)


def error_lines(stderr):
    return [line for line in stderr.strip().splitlines() if line.startswith("error")]


def run_embedded(run_dir, config=None, timeout=900, overrides=(), env=None):
    """Run an embedded job to its end (`config` None: no --config, what a bare launch runs, i.e.
    configs/default.yaml): (its config as a dict, every metrics record, the step lines), after
    checking exit 0 and step lines 1..run.total_steps (the config's, or an override's)."""
    import yaml
    args = ["--config", config] if config else []
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", *args, f"run.dir={run_dir}",
                          "run.progress=false", *overrides], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout, env=_env(env))
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load(open(ROOT / (config or "configs/default.yaml")))
    for o in overrides:
        if o.startswith("run.total_steps="):
            cfg["run"]["total_steps"] = int(o.partition("=")[2])
    recs = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    step_lines = [r for r in recs if r["kind"] == "step"]
    assert [r["step"] for r in step_lines] == list(range(1, cfg["run"]["total_steps"] + 1))
    return cfg, recs, step_lines


def soak(tmp_path, *args, timeout=400, config="configs/sim.yaml"):
    """scripts/kill_resume.py on a run in `tmp_path/run`: (the process, its JSON verdict)."""
    out = subprocess.run([sys.executable, "scripts/kill_resume.py", "--config", config,
                          "--run-dir", str(tmp_path / "run"), "--log-dir", str(tmp_path / "logs"),
                          *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in out.stderr, out.stderr
    return out, json.loads(out.stdout)


def assert_episodes_redone(out, result, run_dir):
    """A multi-turn soak kept every promise, and episodes in flight at a kill were redone."""
    assert out.returncode == 0 and result["ok"], json.dumps(result["failures"], indent=1)
    assert result["resumes"] >= 1 and result["final_step_is_target"] and result["steps_contiguous"]
    assert result["prompts_exactly_once"] and result["bound_kept_on_resume"]
    assert result["shm_leftovers"] == []
    resumes = [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))
               if r["kind"] == "event" and r["event"] == "resume"]
    assert sum(r["redo"] for r in resumes) > 0         # episodes in flight at a kill were redone


def call_main(main, *args) -> subprocess.CompletedProcess:
    """A tool's `main(argv)` (report, inspect, audit, export) called in this process, its output
    captured: what `python -m orchestrator.<tool> ARGS` returns, without paying the interpreter's and
    torch's imports once per call. Each tool keeps one test through a real process (exit status and
    streams of the process itself)."""
    out, err = io.StringIO(), io.StringIO()
    argv = [str(a) for a in args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:                   # argparse's refusals
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


RANK_PRELOAD = [*TORCH, "tests.integration.test_trainer_ranks"]    # a run's fork server's, + the tests'


def start_ranks(fn, args, nprocs):
    """torch.multiprocessing.start_processes for the tests' own rank groups, forked by a fork server
    that imported torch, transformers' modeling code and the trainer once for this test process (as
    a run's fork server does for its ranks, orchestrator.runtime.forkserver): a rank group costs a
    fork per rank, not two imports of torch. Joins; a rank's failure raises."""
    import multiprocessing
    import torch.multiprocessing as tmp
    multiprocessing.set_forkserver_preload(RANK_PRELOAD)
    tmp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver", join=True)


def signal_and_check(proc, sig, bound, to_group=False, settle=0.0):
    """Send `sig` to a launch (started with start_new_session, so `to_group` reaches its process
    group) after `settle` s; the launch must exit 128+sig within `bound` + 2 s (its
    run.shutdown_timeout_s is `bound`) with no traceback, every process it had gone and none of its
    segments left. Returns its stderr."""
    import signal
    time.sleep(settle)
    children = descendants(proc.pid)
    t0 = time.monotonic()
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=bound + 20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert elapsed <= bound + 2, elapsed
    assert all_gone(children, timeout=1.0) == []
    assert run_segments(proc) == []
    return err
