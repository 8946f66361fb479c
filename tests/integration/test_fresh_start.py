"""A fresh start never deletes history it was not asked to: `run.resume=never` on a run directory
that holds a run is exit 2 naming its newest checkpoint unless `run.overwrite=true`; a non-empty
directory that is not a run directory (the working directory, say) is refused naming what is in
it, with nothing created or deleted there; an empty `run.dir` is refused before any data is read."""
import hashlib
import os
import subprocess
import sys

from orchestrator.run import checkpoint
from tests.integration.lifecycle import ROOT, error_lines, run, run_segments, start, steps


def _tree(d):
    """{relative path: sha1 of the content, or 'dir'} of everything under d (run.lock: its
    name only, it holds the pid of the last launch that locked it)."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs:
            out[os.path.relpath(os.path.join(root, n), d)] = "dir"
        for n in files:
            p = os.path.join(root, n)
            out[os.path.relpath(p, d)] = "lock" if n == "run.lock" else \
                hashlib.sha1(open(p, "rb").read()).hexdigest()
    return out


def _refused(proc):
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert run_segments(proc) == []                 # nothing in /dev/shm from this launch
    return lines[0]


def test_never_on_a_finished_run_is_refused_unless_overwrite(tmp_path):
    # configs/sim.yaml says run.resume=never: the same command twice must not erase the first run
    assert run(tmp_path, "run.total_steps=6", "run.checkpoint_every=3").returncode == 0
    before = _tree(tmp_path)
    line = _refused(start(tmp_path, "run.total_steps=6", "run.checkpoint_every=3"))
    assert "step_00000006" in line and "run.overwrite=true" in line and str(tmp_path) in line
    assert _tree(tmp_path) == before                # not a byte changed
    assert [s for s, _ in checkpoint.committed(str(tmp_path))] == [6, 3]
    for _, path in checkpoint.committed(str(tmp_path)):
        checkpoint.validate(path)
    out = run(tmp_path, "run.total_steps=4", "run.overwrite=true")
    assert out.returncode == 0, out.stderr
    assert [r["step"] for r in steps(tmp_path)] == [1, 2, 3, 4]
    assert not any(r["resumed"] for r in steps(tmp_path))
    assert [s for s, _ in checkpoint.committed(str(tmp_path))] == [4]


def test_overwrite_is_refused_without_resume_never(tmp_path):
    out = run(tmp_path / "run", "run.resume=auto", "run.overwrite=true")
    assert out.returncode == 2 and len(error_lines(out.stderr)) == 1
    assert "run.overwrite" in out.stderr and "run.resume=never" in out.stderr
    assert not (tmp_path / "run").exists()


def test_a_foreign_directory_is_refused_and_left_untouched(tmp_path):
    d = tmp_path / "project"
    (d / "checkpoints").mkdir(parents=True)
    (d / "checkpoints" / "model-500.bin").write_bytes(b"someone else's weights")
    (d / "notes.txt").write_text("mine")
    before = _tree(d)
    for extra in ((), ("run.overwrite=true",), ("run.resume=auto",)):
        line = _refused(start(d, "run.total_steps=3", *extra))
        assert "notes.txt" in line and "checkpoints/model-500.bin" in line and str(d) in line
        assert _tree(d) == before                   # no run.lock, nothing deleted
    # a run directory with a foreign file in checkpoints/ is no run directory either
    assert run(tmp_path / "run", "run.total_steps=2").returncode == 0
    (tmp_path / "run" / "checkpoints" / "keep-me").write_text("x")
    line = _refused(start(tmp_path / "run", "run.total_steps=2", "run.overwrite=true"))
    assert "checkpoints/keep-me" in line
    assert (tmp_path / "run" / "checkpoints" / "step_00000002").is_dir()


def test_run_dir_dot_in_a_working_directory_with_files_deletes_nothing(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best.pt").write_bytes(b"w")
    (tmp_path / "batches").mkdir()
    (tmp_path / "train.py").write_text("print('hi')\n")
    before = _tree(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config",
                          str(ROOT / "configs" / "sim.yaml"), "run.dir=.", "run.total_steps=2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "train.py" in out.stderr
    assert _tree(tmp_path) == before


def test_empty_run_dir_is_refused_before_the_data_is_read(tmp_path):
    for value in ('""', "'  '"):
        out = run(value, "task.name=dataset", "task.reward=exact_match",
                  f"task.dataset={tmp_path / 'missing.jsonl'}", "eval.every_steps=0",
                  config="configs/default.yaml")
        lines = error_lines(out.stderr)
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert "run.dir" in lines[0] and "empty" in lines[0] and "task.dataset" not in lines[0]
    assert not (ROOT / "checkpoints").exists() and not (ROOT / "batches").exists()
