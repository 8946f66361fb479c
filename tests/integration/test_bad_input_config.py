"""Bad config input through the real entry point: not UTF-8, duplicate keys, values of the wrong type
(no coercion across bool/int/float/str), inf/NaN, absurd sizes and counts, more CPU threads than the
machine can run, devices that are malformed, shared, unevenly split, absent or given to a sim
backend, records or shared memory beyond what the machine has. Each is exit 2 with one stderr line
("error: ...") naming the field, no traceback, no run dir, nothing in /dev/shm."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.lifecycle import run_segments

ROOT = Path(__file__).resolve().parents[2]
SIM = ["--config", "configs/sim.yaml"]
CPUS = len(os.sched_getaffinity(0))
TIB = 1 << 40

# (id, config file bytes or None, args, needles that must all be on the error line; {file}: its path)
CASES = [
    # the file itself
    ("not-utf8", b"run:\n  total_steps: 3\n  seed: 1 # caf\xe9\n", [], ["{file}", "not UTF-8", "line 3"]),
    ("dup-nested", b"run:\n  total_steps: 3\n  seed: 1\n  total_steps: 4\n", [],
     ["{file}", "duplicate key 'run.total_steps'", "line 4"]),
    ("dup-top", b"run:\n  seed: 1\nrollout:\n  group_size: 2\nrun:\n  seed: 2\n", [],
     ["{file}", "duplicate key 'run'", "line 5"]),
    ("dup-deep", b"inference:\n  sim:\n    latency_s: 0.1\n    latency_s: 0.2\n", [],
     ["{file}", "duplicate key 'inference.sim.latency_s'"]),
    ("inf-in-file", b"actor:\n  max_grad_norm: .inf\n", [], ["actor.max_grad_norm", "finite"]),
    # no coercion across bool/int/float/str
    ("bool-for-int", None, ["run.total_steps=true"], ["run.total_steps", "integer"]),
    ("fraction-for-int", None, ["rollout.group_size=2.5"], ["rollout.group_size"]),
    ("float-for-int", None, ["rollout.consumer_batch_size=8.0"], ["rollout.consumer_batch_size"]),
    ("str-for-int", None, ["run.total_steps='3'"], ["run.total_steps"]),
    ("int-for-str", None, ["task.name=5"], ["task.name", "string"]),
    ("bool-for-float", None, ["actor.lr=true"], ["actor.lr"]),
    ("int-for-bool", None, ["run.progress=1"], ["run.progress"]),
    # inf / NaN
    ("inf", None, ["run.shutdown_timeout_s=.inf"], ["run.shutdown_timeout_s", "finite"]),
    ("nan", None, ["actor.lr=.nan"], ["actor.lr", "finite"]),
    ("sim-inf", None, [*SIM, "inference.sim.latency_high_s=.inf"], ["inference.sim.latency_high_s"]),
    # absurd sizes and counts
    ("workers", None, ["inference.num_workers=100000"], ["inference.num_workers"]),
    ("threads", None, ["inference.threads_per_worker=100000"], ["inference.threads_per_worker"]),
    ("steps", None, ["run.total_steps=1000000000000"], ["run.total_steps"]),
    ("queue", None, ["rollout.queue_size=1000000000"], ["rollout.queue_size"]),
    ("startup-timeout", None, ["run.startup_timeout_s=1e9"], ["run.startup_timeout_s"]),
    ("sync-timeout", None, ["weights.sync_timeout_s=1.0e12"], ["weights.sync_timeout_s"]),
    ("new-tokens", None, ["rollout.max_new_tokens=100000000"], ["rollout.max_new_tokens"]),
    ("seed", None, ["run.seed=-1"], ["run.seed"]),
    ("heads", None, ["model.num_heads=5"], ["model.num_heads"]),
    ("unknown-task", None, [*SIM, "task.name=nope"], ["task.name"]),
    ("cpu-threads", None, [*SIM, f"inference.threads_per_worker={8 * CPUS + 1}"],
     ["inference.threads_per_worker", "CPU"]),
    # devices
    ("device-twice", None, ["inference.num_workers=2", "inference.devices=['0','0']"],
     ["inference.devices", "twice"]),
    ("devices-uneven", None, ["inference.num_workers=2", "inference.devices=['0','1','2']"],
     ["inference.devices", "inference.num_workers"]),
    ("device-gpu0", None, ["inference.devices=['gpu0']"], ["inference.devices"]),
    ("device-empty", None, ["inference.devices=['']"], ["inference.devices"]),
    ("actor-minus-1", None, ["actor.device=-1"], ["actor.device"]),
    ("actor-empty", None, ["actor.device=''"], ["actor.device"]),
    ("device-absent", None, ["inference.devices=['4096']"], ["inference.devices", "does not exist"]),
    ("actor-absent", None, ["actor.device=4096"], ["actor.device", "does not exist"]),
    ("ranks-absent", None, ["actor.devices=['4094','4095']"], ["actor.devices", "does not exist"]),
    ("ranks-overlap", None, ["inference.devices=['0']", "actor.devices=['0','1']"],
     ["actor.devices", "overlaps inference.devices"]),
    ("ranks-twice", None, ["actor.devices=['1','1']"], ["actor.devices", "twice"]),
    ("ranks-too-many", None, ["actor.num_ranks=65"], ["actor.num_ranks"]),
    ("ranks-cpu-threads", None, [f"actor.num_ranks={8 * CPUS + 1}", "actor.threads=1"]
     if 8 * CPUS + 1 <= 64 else ["actor.num_ranks=64", f"actor.threads={CPUS}"],
     ["actor.num_ranks", "CPU"]),
    ("sim-devices", None, [*SIM, "inference.devices=['0']"], ["inference.devices", "sim"]),
    ("sim-actor-device", None, [*SIM, "actor.device='0'"], ["actor.device", "sim"]),
    # beyond the machine's shared memory / the cap on one record
    ("shm-weights", None, [*SIM, f"actor.sim.weight_bytes={TIB}"], ["actor.sim.weight_bytes", "/dev/shm"]),
    ("batch-record", None, [*SIM, "rollout.consumer_batch_size=65536", "rollout.group_size=16",
                           "rollout.max_new_tokens=8192", "inference.sim.completion_tokens=8192"],
     ["rollout.consumer_batch_size", "rollout.group_size", "rollout.max_new_tokens"]),
]


def launch(*args):
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:           # it started a run: stop it, then fail
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"not refused within 60 s (a run started): {err[-2000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc


@pytest.mark.parametrize("text, args, needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_before_anything_starts(tmp_path, launch_main, text, args, needles):
    if "actor.sim.weight_bytes" in needles:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 2 * TIB:
            pytest.skip("/dev/shm could hold 2 TiB of weights")
    if text is not None:
        path = tmp_path / "bad.yaml"
        path.write_bytes(text)
        args = ["--config", str(path), *args]
        needles = [n.replace("{file}", str(path)) for n in needles]
    run_dir = tmp_path / "run"
    code, err = launch_main(*args, f"run.dir={run_dir}")    # no traceback: an exception fails here
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not run_dir.exists()                 # nothing in /dev/shm: the autouse fixture checks


def test_prompt_longer_than_the_models_context_is_refused_at_startup(tmp_path, hf_model_dir,
                                                                     launch_main):
    """Caught before anything starts (exit 2), not by the first request in a worker (exit 1)."""
    import json
    import shutil
    # copy3 prompts ("472>") take more than 2 tokens of the fixture's BPE; this context holds 2
    model = tmp_path / "model"
    shutil.copytree(hf_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2}))
    run_dir = tmp_path / "run"
    code, err = launch_main(f"run.dir={run_dir}", "task.name=copy3", f"model.path={model}",
                            "run.total_steps=2")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "task.name=copy3 has prompts of" in lines[0]
    assert "max_position_embeddings" in lines[0] and "context of 2 tokens" in lines[0]
    assert not run_dir.exists()


def test_vllm_backend_without_vllm_is_bad_input(tmp_path, launch_main):
    import importlib.util
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    code, err = launch_main(f"run.dir={tmp_path / 'run'}", "inference.backend=vllm",
                            "run.total_steps=2")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "inference.backend" in lines[0] and "not installed" in lines[0]
    assert not (tmp_path / "run").exists()


def test_the_process_exits_2_with_one_line_and_no_traceback(tmp_path):
    """The cases above call the launcher in the test's process; this one, refused by preflight
    after the workload is built, is the real process: its exit status, stderr, no segments."""
    run_dir = tmp_path / "run"
    out, proc = launch("inference.devices=['4096']", f"run.dir={run_dir}")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "does not exist" in lines[0]
    assert not run_dir.exists() and run_segments(proc) == []
