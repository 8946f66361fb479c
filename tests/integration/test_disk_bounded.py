"""Disk stays bounded on real runs: checkpoints past run.keep_checkpoints are deleted after each
commit (those at multiples of run.keep_checkpoint_every kept for good), batch files older than
run.keep_batches steps are deleted once a checkpoint covers them, persisted batches are zstd
records; a resume after pruning keeps every promise (steps and prompts once, the bound), and
kill -9 at checkpoint commits and prunes still recovers with every prompt trained exactly once."""
import json
import os

from orchestrator.run.audit import audit
from orchestrator.run.durable import read_record
from tests.integration.lifecycle import run, steps
from tests.integration.lifecycle import soak

COMMON = ["run.checkpoint_every=5", "rollout.filter_zero_std=false", "run.keep_checkpoints=2",
          "run.keep_checkpoint_every=10"]


def _checkpoints(run_dir):
    return sorted(n for n in os.listdir(run_dir / "checkpoints") if n.startswith("step_"))


def test_retention_and_compression(tmp_path):
    out = run(tmp_path, "run.total_steps=30", "run.keep_batches=8", *COMMON)
    assert out.returncode == 0, out.stderr
    assert _checkpoints(tmp_path) == [f"step_{k:08d}" for k in (10, 20, 25, 30)]
    kept = sorted(os.listdir(tmp_path / "batches"))
    assert kept == [f"step_{k:08d}.rec" for k in range(23, 31)]
    for name in kept:
        raw = open(tmp_path / "batches" / name, "rb").read()
        assert raw[:8] == b"ARLREC\0\2" and len(raw) < len(read_record(str(tmp_path / "batches" / name)))
    a = audit(str(tmp_path))
    assert a["ok"] and a["batches_pruned"] == 22, a
    out = run(tmp_path, "run.total_steps=40", "run.resume=auto", "run.keep_batches=8", *COMMON)
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 41))
    assert [r["step"] for r in steps(tmp_path) if r["resumed"]] == [31]
    assert _checkpoints(tmp_path) == [f"step_{k:08d}" for k in (10, 20, 30, 35, 40)]
    assert audit(str(tmp_path))["ok"]


def test_kill_during_commits_and_prunes_keeps_prompts_exactly_once(tmp_path):
    out, result = soak(tmp_path, "--kills", "4", "--seed", "3", "--phases", "checkpoint,steady,recovery",
                       "--hang-timeout", "30", "--timeout", "120",
                       "run.total_steps=40", "run.checkpoint_every=3", "run.keep_checkpoints=1",
                       "actor.sim.step_time_s=0.03")
    assert out.returncode == 0 and result["ok"], json.dumps(result["failures"], indent=1)
    assert result["prompts_exactly_once"] and result["steps_contiguous"] and result["final_step_is_target"]
    assert result["bound_kept_on_resume"] and result["resumes"] >= 1 and result["shm_leftovers"] == []
    assert len(_checkpoints(tmp_path / "run")) == 1
    assert not [n for n in os.listdir(tmp_path / "run" / "checkpoints") if n.endswith(".stale")]
