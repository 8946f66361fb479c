"""Damaged files on the resume path: a checkpoint whose files are unreadable is skipped for the
previous valid one with a warning line in the log; with none left the run exits 2 naming the file
(and deletes nothing); damaged record files never decode into other arrays."""
import shutil

import pytest

from orchestrator.run.durable import RecordError, read_record
from tests.integration.lifecycle import error_lines, run, steps, trained_prompt_ids

COMMON = ["run.checkpoint_every=5", "rollout.filter_zero_std=false", "run.total_steps=10"]


def _flip(path, offset=-1):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def _ckpt(run_dir, step):
    return run_dir / "checkpoints" / f"step_{step:08d}"


@pytest.mark.parametrize("damage", ["supervisor_truncated", "trainer_flipped", "manifest_garbage",
                                    "rollouts_flipped"])
def test_damaged_newest_checkpoint_is_skipped_for_the_previous(tmp_path, damage):
    # the rollouts case needs saved rollouts: slow the trainer so groups wait at checkpoint time
    extra = ["actor.sim.step_time_s=0.1"] if damage == "rollouts_flipped" else []
    # checkpoints at 5, 10 and 12; drop the final one (as a kill before its commit would) so the
    # mid-run step 10, which holds saved rollouts, is the newest
    assert run(tmp_path, *COMMON[:2], "run.total_steps=12", *extra).returncode == 0
    shutil.rmtree(_ckpt(tmp_path, 12))
    ck = _ckpt(tmp_path, 10)
    if damage == "supervisor_truncated":
        (ck / "supervisor.json").write_bytes((ck / "supervisor.json").read_bytes()[:20])
    elif damage == "trainer_flipped":
        _flip(ck / "trainer" / "sim_trainer.json", 2)
    elif damage == "manifest_garbage":
        (ck / "MANIFEST.json").write_text("{not json")
    else:
        assert (ck / "rollouts.rec").exists()
        _flip(ck / "rollouts.rec")
    out = run(tmp_path, "run.resume=must", *COMMON[:2], "run.total_steps=15", *extra)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert [r["step"] for r in steps(tmp_path) if r["resumed"]] == [6]
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 16))
    assert trained_prompt_ids(tmp_path, 15) == list(range(15 * 8))
    log = (tmp_path / "logs" / "supervisor.log").read_text()
    assert "skipped damaged checkpoint" in log and "step_00000010" in log


def test_only_checkpoint_damaged_exits_2_naming_the_file_and_keeps_it(tmp_path):
    assert run(tmp_path, "run.checkpoint_every=0", "run.total_steps=5").returncode == 0
    state = _ckpt(tmp_path, 5) / "supervisor.json"
    state.write_text('{"step": 5, "cursor"')
    out = run(tmp_path, "run.resume=auto", "run.total_steps=8")
    assert out.returncode == 2
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and "supervisor.json" in lines[0] and "Traceback" not in out.stderr
    assert state.exists()                       # nothing deleted


def test_damaged_batch_record_is_refused_not_misread(tmp_path):
    assert run(tmp_path, "run.total_steps=3").returncode == 0
    path = tmp_path / "batches" / "step_00000002.rec"
    read_record(str(path))
    size = path.stat().st_size
    for offset in (40, size // 2, size - 1):           # header, body, last byte
        good = path.read_bytes()
        _flip(path, offset)
        with pytest.raises(RecordError, match="step_00000002.rec"):
            read_record(str(path))
        path.write_bytes(good)
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(RecordError, match="truncated"):
        read_record(str(path))


def test_pruning_never_counts_a_damaged_checkpoint(tmp_path):
    # checkpoints 5 and 10; 10 is damaged on disk; with run.keep_checkpoints=1 the resumed run
    # commits 8: the damaged 10 must not count as the kept one, or 8 and 5 would both go
    from orchestrator.run import checkpoint
    assert run(tmp_path, *COMMON[:2], "run.total_steps=10", "run.keep_checkpoints=2").returncode == 0
    _flip(_ckpt(tmp_path, 10) / "trainer" / "sim_trainer.json", 2)
    out = run(tmp_path, "run.resume=must", *COMMON[:2], "run.total_steps=8", "run.checkpoint_every=0",
              "run.keep_checkpoints=1")
    assert out.returncode == 0, out.stderr
    assert [s for s, _ in checkpoint.committed(str(tmp_path))] == [10, 8]   # 5 pruned, 10 kept aside
    assert checkpoint.find_resumable(str(tmp_path)).path == str(_ckpt(tmp_path, 8))
    out = run(tmp_path, "run.resume=must", *COMMON[:2], "run.total_steps=12", "run.keep_checkpoints=1")
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(tmp_path) if r["resumed"]] == [6, 9]
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 13))
    assert trained_prompt_ids(tmp_path, 12) == list(range(12 * 8))
    assert [s for s, _ in checkpoint.committed(str(tmp_path))] == [12]     # 10 rewritten, then pruned
    checkpoint.validate(str(_ckpt(tmp_path, 12)))
