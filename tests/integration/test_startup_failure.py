"""Startup failures: the run stops with one clear line, every child is gone, nothing is left in
/dev/shm, and no checkpoint is written."""
import json
import time

from tests.integration.lifecycle import all_gone, descendants, run_segments, start


def watch(proc):
    """Wait for a run to end, remembering every process it spawned on the way."""
    children = []
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        children += [c for c in descendants(proc.pid) if c not in children]
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    return children, err


def test_broken_model_directory_is_bad_input(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    run_dir = tmp_path / "run"
    proc = start(run_dir, f"model.path={model}", config="configs/default.yaml")
    children, err = watch(proc)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "model.path" in lines[0] and "Traceback" not in err
    assert all_gone(children, timeout=5.0) == [] and run_segments(proc) == []
    assert not (run_dir / "checkpoints" / "latest").exists()


def test_worker_failing_at_startup_stops_the_run_cleanly(tmp_path, hf_model_dir):
    # a model directory whose config is fine (the supervisor sizes the weights from it) but whose
    # weights file is cut short: the workers fail while loading it
    import shutil
    model = tmp_path / "model"
    shutil.copytree(hf_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    run_dir = tmp_path / "run"
    proc = start(run_dir, f"model.path={model}", "eval.every_steps=0", config="configs/default.yaml")
    children, err = watch(proc)
    assert proc.returncode == 1
    lines = [l for l in err.strip().splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and " worker 0 failed at startup" in lines[0], err
    assert f"{run_dir}/logs" in lines[0] and "Traceback" not in err
    assert all_gone(children, timeout=5.0) == [] and run_segments(proc) == []
    assert not (run_dir / "checkpoints" / "latest").exists()
    role = "trainer" if "trainer worker" in lines[0] else "inference"
    assert "Traceback" in (run_dir / "logs" / f"{role}0.log").read_text()


def test_startup_timeout_is_reported(tmp_path):
    proc = start(tmp_path, "run.startup_timeout_s=0.01")
    children, err = watch(proc)
    assert proc.returncode == 1
    assert "not ready within run.startup_timeout_s=0.01" in err
    assert all_gone(children, timeout=5.0) == [] and run_segments(proc) == []
