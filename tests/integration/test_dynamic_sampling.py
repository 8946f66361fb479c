"""DAPO's dynamic sampling end to end (sim backend): on a task where most groups have equal rewards,
every step still trains B groups that differ, each filtered group frees its gate slot for a new
prompt, and every prompt is consumed exactly once, trained or filtered (the audit counts both),
across kill -9 and resume too."""
import json

import pytest

from orchestrator.run.audit import audit
from tests.integration.lifecycle import run, steps
from tests.integration.lifecycle import soak

B, G = 8, 4
MOSTLY_EQUAL = ["rollout.dynamic_sampling=true", "inference.sim.reward_p=0.05",   # 0.95^4: ~81% all 0
                f"rollout.group_size={G}", f"rollout.consumer_batch_size={B}"]


def test_every_step_trains_b_groups_that_differ(tmp_path):
    total = 15
    out = run(tmp_path / "run", f"run.total_steps={total}", "run.checkpoint_every=5", *MOSTLY_EQUAL)
    assert out.returncode == 0, out.stderr
    lines = steps(tmp_path / "run")
    assert [x["step"] for x in lines] == list(range(1, total + 1))
    assert all(x["trainable"] == B * G and x["groups"] == B for x in lines)
    filtered = sum(x["filtered_groups"] for x in lines)
    assert filtered > total * B                  # most groups were filtered, none trained
    assert filtered == sum(x["filtered"] for x in lines) == sum(len(x["filtered_prompts"]) for x in lines)
    assert sum(x["admitted"] for x in lines) == total * B + filtered
    res = audit(str(tmp_path / "run"))
    assert res["ok"] and res["prompts_exactly_once"], res["failures"]


@pytest.mark.slow
def test_kill_resume_soak_with_dynamic_sampling(tmp_path):
    total = 40
    out, result = soak(tmp_path, "--kills", "3", "--seed", "5", "--phases", "steady,checkpoint,recovery",
                       "--hang-timeout", "40", "--timeout", "120", f"run.total_steps={total}",
                       "run.checkpoint_every=4", "rollout.filter_zero_std=false", *MOSTLY_EQUAL)
    assert out.returncode == 0 and result["ok"], json.dumps(result["failures"], indent=1) + out.stderr
    assert result["resumes"] >= 1 and any(r["killed"] for r in result["rounds"])
    assert result["prompts_exactly_once"] and result["bound_kept_on_resume"]
    assert result["steps_contiguous"] and result["final_step_is_target"]
    assert sum(x["filtered_groups"] for x in steps(tmp_path / "run")) > 0
