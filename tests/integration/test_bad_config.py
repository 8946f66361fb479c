"""Bad configuration or input: exit 2, one line naming the field, no traceback, nothing started,
no run directory and nothing in /dev/shm created."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.lifecycle import run_segments

ROOT = Path(__file__).resolve().parents[2]


def launch(*args):
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc


@pytest.mark.parametrize("args, needle", [
    (["rollout.max_head_offpolicynes=2"], "rollout.max_head_offpolicyness"),
    (["rollout.consumer_batch_size=0"], "rollout.consumer_batch_size"),
    (["inference.backend=tensorrt"], "inference.backend"),
    (["model.path=/no/such/dir"], "model.path"),
    (["actor.use_decoupled_loss=true", "actor.recompute_logprob=false"], "recompute_logprob"),
    (["run.resume=must"], "no checkpoint"),
    (["--config", "configs/no_such.yaml"], "cannot read config file"),
    (["run.total_steps"], "key=value"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, launch_main, args, needle):
    run_dir = tmp_path / "run"
    code, err = launch_main(f"run.dir={run_dir}", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    if needle != "no checkpoint":            # resume=must looks into run.dir before refusing
        assert not run_dir.exists()


def test_the_process_exits_2_with_one_line_and_no_traceback(tmp_path):
    """The cases above call the launcher in the test's process; this one is the real process."""
    run_dir = tmp_path / "run"
    out, proc = launch(f"run.dir={run_dir}", "rollout.max_head_offpolicynes=2")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "rollout.max_head_offpolicyness" in lines[0], out.stderr
    assert not run_dir.exists() and run_segments(proc) == []


def test_bad_yaml_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  total_steps: [1,\n")
    out, _ = launch("--config", str(bad), f"run.dir={tmp_path / 'run'}")
    assert out.returncode == 2 and "not valid YAML" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
