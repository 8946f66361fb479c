"""Metric sinks beside metrics.jsonl on real sim runs: TensorBoard event files read back with
tensorboard's own reader hold every numeric step and tick field under its stable name with the same
values; a W&B offline run directory is created and a resumed launch continues the same W&B run; a
sink that cannot start (its directory blocked by a file, wandb missing) warns once and the run
finishes with every metrics line."""
import json
import os
import subprocess
import sys

import pytest

from tests.integration.lifecycle import ROOT, run


def _records(run_dir, kind):
    return [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if r["kind"] == kind]


def _numeric(rec):
    return {k: float(v) for k, v in rec.items()
            if k not in ("kind", "time", "step") and isinstance(v, (bool, int, float))}


def test_tensorboard_holds_every_step_and_tick_field(tmp_path):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    out = run(tmp_path, "run.total_steps=20", "metrics.tensorboard=true", "metrics.interval_s=0.2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "warning" not in out.stderr
    ea = ea_mod.EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={ea_mod.SCALARS: 0})
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    steps = _records(tmp_path, "step")
    assert len(steps) == 20
    for field in _numeric(steps[0]):
        got = {e.step: e.value for e in ea.Scalars(f"train/{field}")}
        want = {r["step"]: _numeric(r)[field] for r in steps if field in _numeric(r)}
        assert got.keys() == want.keys(), field
        assert all(got[s] == pytest.approx(v, rel=1e-6, abs=1e-6) for s, v in want.items()), field
    ticks = _records(tmp_path, "tick")
    assert ticks and {f"pipeline/{k}" for k in _numeric(ticks[0])} <= tags
    assert [e.value for e in ea.Scalars("pipeline/inflight")] == [float(t["inflight"]) for t in ticks]


def test_wandb_offline_run_continues_across_a_resume(tmp_path):
    pytest.importorskip("wandb")
    for total in (10, 20):
        out = run(tmp_path, f"run.total_steps={total}", "run.resume=auto", "metrics.wandb.project=arl-test")
        assert out.returncode == 0, out.stderr[-2000:]
        assert "warning" not in out.stderr, out.stderr
    run_id = (tmp_path / "logs" / "wandb_run_id").read_text().strip()
    runs = sorted(p for p in os.listdir(tmp_path / "wandb") if p.startswith("offline-run-"))
    assert len(runs) == 2 and all(p.endswith(f"-{run_id}") for p in runs)
    for p in runs:
        data = tmp_path / "wandb" / p / f"run-{run_id}.wandb"
        assert data.stat().st_size > 0


def test_a_sink_that_cannot_start_warns_once_and_the_run_goes_on(tmp_path):
    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "run"
    for name in ("tensorboard", "wandb"):     # imports that fail, as when the package is missing
        blocker = tmp_path / "missing" / name  # (a fresh start clears run_dir/tensorboard itself)
        blocker.mkdir(parents=True)
        (blocker / "__init__.py").write_text(f"raise ImportError(\"No module named '{name}'\")\n")
    env_path = os.pathsep.join([str(tmp_path / "missing"), str(ROOT)])
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config", "configs/sim.yaml",
                          f"run.dir={run_dir}", "run.total_steps=15", "metrics.tensorboard=true",
                          "metrics.wandb.project=arl-test"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": env_path})
    assert out.returncode == 0, out.stderr[-2000:]
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning: metrics sink")]
    assert len(warnings) == 2, out.stderr
    assert any("sink tensorboard failed" in w and "No module named 'tensorboard'" in w for w in warnings)
    assert any("sink wandb failed" in w and "No module named 'wandb'" in w for w in warnings)
    assert [r["step"] for r in _records(run_dir, "step")] == list(range(1, 16))
