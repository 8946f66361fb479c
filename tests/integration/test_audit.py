"""`python -m orchestrator.audit RUN_DIR`: a real finished run passes; a damaged batch file or a lost
step line is reported (exit 1) with the step named."""
import json
import subprocess
import sys

from tests.integration.lifecycle import ROOT, run


def audit(run_dir, *args):
    out = subprocess.run([sys.executable, "-m", "orchestrator.audit", str(run_dir), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    return out.returncode, (json.loads(out.stdout) if out.stdout else None), out.stderr


def test_audit_of_a_real_run_and_of_its_damage(tmp_path):
    assert run(tmp_path, "run.total_steps=6", "rollout.filter_zero_std=false").returncode == 0
    code, res, _ = audit(tmp_path)
    assert code == 0 and res["ok"] and res["prompts_exactly_once"] and res["steps_contiguous"]
    batch = tmp_path / "batches" / "step_00000004.rec"
    data = bytearray(batch.read_bytes())
    data[-3] ^= 1
    batch.write_bytes(bytes(data))
    code, res, _ = audit(tmp_path)
    assert code == 1 and not res["prompts_exactly_once"]
    assert any("step 4" in f and "damaged" in f for f in res["failures"])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "metrics.jsonl").write_text("".join(l for l in lines if '"step": 2,' not in l
                                                    or '"kind": "step"' not in l))
    code, res, _ = audit(tmp_path)
    assert code == 1 and not res["steps_contiguous"]
    code, _, err = audit(tmp_path / "nope")
    assert code == 2 and "not a run directory" in err


def test_audit_judges_each_stretch_by_the_retention_it_was_written_under(tmp_path):
    # keep_batches=2 to step 25 (batches 1..23 pruned), raised to 10 to step 30, lowered to 3 to
    # step 35: no false "no batch file"; a batch really lost inside a kept stretch still fails
    common = ["run.checkpoint_every=5", "rollout.filter_zero_std=false", "run.resume=auto"]
    for total, keep, pruned in ((25, 2, 23), (30, 10, 23), (35, 3, 32)):
        out = run(tmp_path, f"run.total_steps={total}", f"run.keep_batches={keep}", *common)
        assert out.returncode == 0, out.stderr
        code, res, _ = audit(tmp_path)
        assert code == 0 and res["ok"] and res["steps_contiguous"], res["failures"]
        assert res["batches_pruned"] == pruned     # 21..23 went under keep_batches=2
    (tmp_path / "batches" / "step_00000034.rec").unlink()
    code, res, _ = audit(tmp_path)
    assert code == 1 and not res["prompts_exactly_once"]
    assert any("step 34: no batch file" in f for f in res["failures"]), res["failures"]
