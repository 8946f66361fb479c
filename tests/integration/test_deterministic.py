"""run.deterministic (loop.lockstep): two launches of one config and seed make the same run: the
learning fields of every step line, the persisted batches and the checkpoints' weights equal to
the bit, whatever the timing: a worker stopped and continued at random (SIGSTOP/SIGCONT), the
supervisor killed with SIGKILL and the run resumed. Paths that cannot hold it are refused (exit 2).
"""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.integration.lifecycle import (ROOT, all_gone, descendants, run, start, steps,
                                         wait_for_step, worker_pids)

LEARNING = ("reward_mean", "loss", "train_grad_norm", "train_entropy", "train_approx_kl",
            "train_tokens", "train_sequences", "version", "age_max", "age_mean", "token_age_mean",
            "groups")
DEFAULT = "configs/default.yaml"
MULTITURN = "configs/multiturn.yaml"
SHORT = ("run.deterministic=true", "run.total_steps=14", "run.checkpoint_every=4",
         "eval.every_steps=7", "run.progress=false", "metrics.interval_s=0.5")


def launch(run_dir, *overrides, config=DEFAULT, jitter=None, timeout=300, deterministic=True):
    """A launch to its end; `jitter`: a seed, and its inference workers are stopped (SIGSTOP) and
    continued at random moments for 0-150 ms each while it runs."""
    base = SHORT if deterministic else SHORT[1:]
    if jitter is None:
        out = run(run_dir, *base, *overrides, config=config, timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return
    began = time.time() - 1.0              # mtime granularity
    proc = start(run_dir, *base, *overrides, config=config)
    done = threading.Event()
    stopped = []

    def shake():
        rng = random.Random(jitter)
        pids_file = Path(run_dir) / "logs" / "pids.json"
        while not done.is_set() and not (pids_file.exists()            # this launch's, not
                                         and pids_file.stat().st_mtime >= began):  # a resumed one's
            done.wait(0.02)
        while not done.is_set():
            try:
                pids = [p for name, p in worker_pids(run_dir).items() if name.startswith("inference")]
            except (OSError, json.JSONDecodeError):
                pids = []
            if not pids:                # not written yet (or mid-write)
                done.wait(0.02)
                continue
            pid = rng.choice(pids)
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
                done.wait(rng.uniform(0.0, 0.15))
            except ProcessLookupError:       # the run ended meanwhile
                break
            finally:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            done.wait(rng.uniform(0.0, 0.1))

    t = threading.Thread(target=shake, daemon=True)
    t.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        done.set()
        t.join(5)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert len(stopped) >= 5        # the workers really were made slow, again and again


def assert_same_run(a, b, total=14):
    sa, sb = steps(a), steps(b)
    assert [r["step"] for r in sa] == [r["step"] for r in sb] == list(range(1, total + 1))
    for x, y in zip(sa, sb):
        assert {k: x.get(k) for k in LEARNING} == {k: y.get(k) for k in LEARNING}, x["step"]
    batches = sorted(os.listdir(Path(a) / "batches"))
    assert len(batches) == total and batches == sorted(os.listdir(Path(b) / "batches"))
    for name in batches:             # token ids, logprobs, versions, rewards, advantages
        assert (Path(a) / "batches" / name).read_bytes() == (Path(b) / "batches" / name).read_bytes(), name
    ckpts = sorted(n for n in os.listdir(Path(a) / "checkpoints") if n.startswith("step_"))
    assert ckpts and ckpts == sorted(n for n in os.listdir(Path(b) / "checkpoints") if n.startswith("step_"))
    for name in ckpts:
        assert_same_weights(Path(a) / "checkpoints" / name, Path(b) / "checkpoints" / name)


def assert_same_weights(a: Path, b: Path):
    """The trainer state of two checkpoint directories holds equal tensors, file for file (a
    sharded DCP directory read whole)."""
    files = sorted(p.relative_to(a) for p in (a / "trainer").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in (b / "trainer").rglob("*") if p.is_file())
    compared = 0
    for rel in files:
        if rel.suffix == ".safetensors":
            from safetensors.torch import load_file
            x, y = load_file(a / rel), load_file(b / rel)
        elif rel.suffix == ".pt":
            x, y = torch.load(a / rel, weights_only=False), torch.load(b / rel, weights_only=False)
        elif rel.name == ".metadata":
            x, y = _dcp(a / rel.parent), _dcp(b / rel.parent)
        elif rel.suffix == ".json" and rel.parent == Path("trainer"):    # the sim trainer's state
            x, y = json.loads((a / rel).read_text()), json.loads((b / rel).read_text())
        else:
            continue
        assert _equal(x, y), f"{a.name}/{rel}"
        compared += 1
    assert compared >= (2 if (a / "trainer" / "hf").exists() else 1)   # weights and optimizer


def _dcp(directory: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(directory), os.path.join(tmp, "whole.pt"))
        return torch.load(os.path.join(tmp, "whole.pt"), weights_only=False)


def _equal(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_equal(p, q) for p, q in zip(x, y))
    return x == y


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The default job, deterministic, 14 steps undisturbed (checkpoints at 4, 8, 12, 14)."""
    d = tmp_path_factory.mktemp("det_ref") / "run"
    launch(d)
    return d


def test_a_worker_made_slow_at_random_gives_the_same_run(reference, tmp_path):
    launch(tmp_path / "run", jitter=1)
    assert_same_run(reference, tmp_path / "run")


def test_kill_9_and_resume_equals_the_uninterrupted_run(reference, tmp_path):
    """SIGKILL of the supervisor after step 6 (past the checkpoint of step 4, whose later batches
    were generated by older versions): the resumed run equals the reference step for step."""
    kill_9_and_resume(tmp_path / "run")
    assert_same_run(reference, tmp_path / "run")


def kill_9_and_resume(d, *extra, config=DEFAULT):
    """A launch whose supervisor is killed with SIGKILL after step 6, then resumed to its end."""
    proc = start(d, *SHORT, *extra, config=config)
    try:
        wait_for_step(proc, d, 6, timeout=120)
        children = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert all_gone(children, timeout=10) == []
    finally:
        if proc.poll() is None:
            proc.kill()
    assert steps(d)[-1]["step"] < 14
    launch(d, *extra, config=config)
    recs = [json.loads(x) for x in open(d / "metrics.jsonl")]
    assert any(r.get("event") == "resume" for r in recs)


def test_two_workers_reward_threads_and_the_hard_bound(tmp_path):
    """Two inference workers (each stopped at random in one of the runs), the reward pool's threads
    and the hard age bound: still one run."""
    extra = ("inference.num_workers=2", "task.reward_workers=2",
             "rollout.max_observed_offpolicyness=2")
    launch(tmp_path / "a", *extra)
    launch(tmp_path / "b", *extra, jitter=2)
    assert_same_run(tmp_path / "a", tmp_path / "b")


def test_lora(tmp_path):
    extra = ("actor.lora.rank=4", "actor.lora.alpha=8", "actor.lr=1e-3")
    launch(tmp_path / "a", *extra)
    launch(tmp_path / "b", *extra, jitter=3)
    assert_same_run(tmp_path / "a", tmp_path / "b")


def test_the_multi_turn_lookup_job(tmp_path):
    """The multi-turn tool job with a random tool latency (drawn from each episode's keyed rng) on
    two workers: episodes finish their turns in any order, the turns sharing a forward pass do
    not change; killed with SIGKILL after step 6 and resumed, it is still the same run."""
    extra = ("inference.num_workers=2", "task.env_args.latency_s=0.003",
             "task.env_args.latency_sigma=1.0")
    launch(tmp_path / "a", *extra, config=MULTITURN)
    launch(tmp_path / "b", *extra, config=MULTITURN, jitter=6)
    assert_same_run(tmp_path / "a", tmp_path / "b")
    kill_9_and_resume(tmp_path / "c", *extra, config=MULTITURN)
    assert_same_run(tmp_path / "a", tmp_path / "c")
    recs = steps(tmp_path / "a")
    assert sum(r["tool_calls"] for r in recs) > 0 and max(r["turns_max"] for r in recs) >= 2


@pytest.mark.slow           # two two-rank launches
def test_two_trainer_ranks(tmp_path):
    extra = ("actor.num_ranks=2",)
    launch(tmp_path / "a", *extra)
    launch(tmp_path / "b", *extra, jitter=4)
    assert_same_run(tmp_path / "a", tmp_path / "b")


def test_the_sim_backend_under_a_long_tail(tmp_path):
    """The sim backends, two workers, lognormal latency (sigma 1.0): arrival order is random, the
    run is not."""
    extra = ("inference.sim.latency=lognormal", "inference.sim.lognormal_sigma=1.0",
             "inference.sim.latency_s=0.02")
    for d in ("a", "b"):
        launch(tmp_path / d, *extra, config="configs/sim.yaml")
    sa = steps(tmp_path / "a")
    assert_same_run(tmp_path / "a", tmp_path / "b")
    assert max(r["age_max"] for r in sa) == 2      # the overlap is kept: heads S versions old


def test_a_finished_run_extended_is_one_run(tmp_path):
    """A run that ended at step 14 relaunched with run.total_steps=20: its checkpoint has no batch
    15 or 16 (their versions, 12 and 13, are gone), so the resumed version generates them (once
    hung for ever: no wave was ever due). Two such extensions, one disturbed, are one run."""
    tail = ("inference.sim.latency=lognormal", "inference.sim.lognormal_sigma=1.0",
            "inference.sim.latency_s=0.05")
    for d, jitter in (("a", None), ("b", 7)):
        launch(tmp_path / d, *tail, config="configs/sim.yaml", timeout=60)
        launch(tmp_path / d, *tail, "run.total_steps=20", "run.resume=auto",
               config="configs/sim.yaml", jitter=jitter, timeout=60)
    assert_same_run(tmp_path / "a", tmp_path / "b", total=20)
    ages = [r["age_max"] for r in steps(tmp_path / "a")[14:]]
    assert ages == [0, 1, 2, 2, 2, 2]         # 15-17 by version 14, then the lag again


def test_a_sigterm_drain_resumes_to_the_end(tmp_path):
    """SIGTERM after step 6: the drain checkpoints where it stopped, without the batches after
    it; the resume generates them at its own version instead of waiting for versions that are
    gone (it hung for ever)."""
    d = tmp_path / "run"
    proc = start(d, *SHORT, "actor.sim.step_time_s=0.05", config="configs/sim.yaml")
    try:
        wait_for_step(proc, d, 6, timeout=60)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert steps(d)[-1]["step"] < 14
    launch(d, "actor.sim.step_time_s=0.05", "run.resume=auto", config="configs/sim.yaml",
           timeout=60)
    assert [r["step"] for r in steps(d)] == list(range(1, 15))


def test_a_free_run_is_not_replayed(tmp_path):
    """The check above is not vacuous: without run.deterministic, the same disturbance (workers
    stopped at random in one of two launches) makes another run. (Two undisturbed free sim runs
    can coincide: the sim draws each latency from the seed and the request id.)"""
    extra = ("inference.sim.latency=lognormal", "inference.sim.lognormal_sigma=1.0",
             "inference.sim.latency_s=0.02")
    launch(tmp_path / "a", *extra, config="configs/sim.yaml", deterministic=False)
    launch(tmp_path / "b", *extra, config="configs/sim.yaml", deterministic=False, jitter=5)
    with pytest.raises(AssertionError):
        assert_same_run(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize("overrides, names", [
    (("inference.backend=vllm",), "inference.backend=vllm"),
    (("task.agent=examples.agents:nothing",), "task.agent="),
])
def test_paths_that_cannot_hold_it_are_refused(tmp_path, overrides, names):
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config", DEFAULT,
                          f"run.dir={tmp_path / 'run'}", "run.deterministic=true", *overrides],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.deterministic=true" in lines[0] and names in lines[0], lines
    assert not (tmp_path / "run").exists()
