"""scripts/kill_resume.py on configs/sim.yaml: kill -9 at random moments, resume, all checks hold."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_kill_resume_soak_on_sim(tmp_path):
    out = subprocess.run([sys.executable, "scripts/kill_resume.py", "--config", "configs/sim.yaml",
                          "--kills", "3", "--seed", "1", "--run-dir", str(tmp_path),
                          "run.total_steps=60", "run.checkpoint_every=5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=400)
    result = json.loads(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert result["ok"] and result["final_returncode"] == 0
    killed = [r for r in result["rounds"] if r["killed"]]
    assert len(killed) >= 2
    assert all(r["children_alive_after_5s"] == 0 for r in killed)
    assert result["steps_contiguous"] and result["final_step_is_target"]
    assert result["bound_kept_on_resume"] and result["shm_leftovers"] == []
    assert result["resumed_steps"], "no round got far enough to checkpoint"
