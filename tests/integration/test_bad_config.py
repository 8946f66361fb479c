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
def test_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    run_dir = tmp_path / "run"
    out, proc = launch(f"run.dir={run_dir}", *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    if needle != "no checkpoint":            # resume=must looks into run.dir before refusing
        assert not run_dir.exists()
    assert run_segments(proc) == []


def test_bad_yaml_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  total_steps: [1,\n")
    out, _ = launch("--config", str(bad), f"run.dir={tmp_path / 'run'}")
    assert out.returncode == 2 and "not valid YAML" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
