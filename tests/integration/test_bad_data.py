"""Bad workload input through `python -m orchestrator.launch`: a dataset that is missing, unreadable,
empty or lacks the prompt column, a reward that cannot be resolved, a prompt over
task.max_prompt_tokens with task.overlong_prompts=error: exit 2 with one stderr line naming it,
before anything starts (no run dir, nothing in /dev/shm). A reward function that raises at run time
is exit 2 naming the function and the row; with task.reward_on_error=zero the run completes and
the step lines count the failures."""
import json
import os
import subprocess
import sys

import pytest

from tests.integration.lifecycle import ROOT, steps

pytest.importorskip("datasets")

BASE = ["--config", str(ROOT / "configs/default.yaml"), "task.name=dataset", "eval.every_steps=0",
        "run.progress=false"]
RAISES = '''
def score(completion, row, ids):
    if row["prompt"] == "13>":
        raise ZeroDivisionError("row 13 is cursed")
    return float(completion == row["answer"])
'''


def launch(tmp_path, *args, timeout=240):
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "orchestrator.launch", *BASE,
                           f"run.dir={tmp_path / 'run'}", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": path})


def digit_rows(n=20):
    return [{"prompt": f"{i:02d}>", "answer": f"{i:02d}"} for i in range(n)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def put(path, data):
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
    return path


def _bad(tmp_path, launch_main, make, args):
    data = make(tmp_path)
    return launch_main(*BASE, f"run.dir={tmp_path / 'run'}", f"task.dataset={data}", *args,
                       cwd=tmp_path)


CASES = [
    ("missing", lambda p: p / "nope.jsonl", ["task.reward=exact_match"],
     ["task.dataset", "nope.jsonl", "no such file"]),
    ("no-column", lambda p: write_jsonl(p / "d.jsonl", [{"question": "1>", "answer": "1"}]),
     ["task.reward=exact_match"], ["task.dataset", "no column 'prompt'", "question"]),
    ("no-answer-column", lambda p: write_jsonl(p / "d.jsonl", [{"prompt": "1>", "label": "1"}]),
     ["task.reward=exact_match"], ["no column 'answer'", "task.answer_field"]),
    ("empty", lambda p: write_jsonl(p / "d.jsonl", []), ["task.reward=exact_match"],
     ["task.dataset", "d.jsonl"]),
    ("garbage-parquet", lambda p: put(p / "d.parquet", b"not parquet at all"),
     ["task.reward=exact_match"], ["task.dataset", "d.parquet", "cannot read it as parquet"]),
    ("unknown-format", lambda p: put(p / "d.txt", "x"),
     ["task.reward=exact_match"], ["task.dataset", "unknown format"]),
    ("prompt-not-text", lambda p: write_jsonl(p / "d.jsonl", [{"prompt": 5, "answer": "1"}]),
     ["task.reward=exact_match"], ["task.dataset row 0", "int"]),
    ("reward-file-missing", lambda p: write_jsonl(p / "d.jsonl", digit_rows()),
     ["task.reward=missing.py:score"], ["task.reward", "no such file"]),
    ("reward-no-function", lambda p: put(p / "r.py", "x = 1\n") and write_jsonl(p / "d.jsonl", digit_rows()),
     ["task.reward=r.py:score"],
     ["task.reward", "no function 'score'"]),
    ("overlong-error", lambda p: write_jsonl(p / "d.jsonl", digit_rows() + [{"prompt": "1" * 30 + ">",
                                                                            "answer": "1"}]),
     ["task.reward=exact_match", "task.max_prompt_tokens=8", "task.overlong_prompts=error"],
     ["task.dataset row 20", "longer than task.max_prompt_tokens=8"]),
    ("eval-missing", lambda p: write_jsonl(p / "d.jsonl", digit_rows()),
     ["task.reward=exact_match", "task.eval_dataset=/nonexistent/e.jsonl"],
     ["task.eval_dataset", "no such file"]),
]


@pytest.mark.parametrize("make, args, needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_data_is_exit_2_before_anything_starts(tmp_path, launch_main, make, args, needles):
    code, err = _bad(tmp_path, launch_main, make, args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not (tmp_path / "run").exists()


def test_the_process_exits_2_naming_the_dataset(tmp_path):
    """The cases above call the launcher in the test's process; this one is the real process."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"question": "1>", "answer": "1"}])
    out = launch(tmp_path, f"task.dataset={data}", "task.reward=exact_match")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no column 'prompt'" in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


def test_a_reward_that_raises_stops_the_run_naming_function_and_row(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", digit_rows())
    (tmp_path / "r.py").write_text(RAISES)
    out = launch(tmp_path, f"task.dataset={tmp_path / 'd.jsonl'}", "task.reward=r.py:score",
                 "run.total_steps=50")
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr.strip().splitlines()[-1]
    assert "'r.py:score'" in err and "row 13" in err and "ZeroDivisionError" in err, err


def test_tolerated_reward_errors_are_counted_and_overlong_prompts_filtered(tmp_path):
    """One launch for two kinds of bad rows: a reward that raises on one row, tolerated
    (`task.reward_on_error=zero`), is counted in the step lines; prompts longer than
    task.max_prompt_tokens are filtered with one warning, counted, and never trained."""
    from orchestrator.run.durable import read_record
    from shm.codec import decode

    long_rows = [{"prompt": "9" * 12 + ">", "answer": "9"}] * 5
    write_jsonl(tmp_path / "d.jsonl", digit_rows() + long_rows)
    (tmp_path / "r.py").write_text(RAISES)
    out = launch(tmp_path, f"task.dataset={tmp_path / 'd.jsonl'}", "task.reward=r.py:score",
                 "task.reward_on_error=zero", "task.max_prompt_tokens=8", "run.total_steps=8")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "warning: 5 prompts longer than task.max_prompt_tokens=8 were filtered out" in out.stderr
    lines = steps(tmp_path / "run")
    assert len(lines) == 8
    # prompt 13's row is drawn once per 20 prompts; each of its 16 samples fails
    assert sum(r["reward_errors"] for r in lines) % 16 == 0 and sum(r["reward_errors"] for r in lines) >= 16
    for step in range(1, 9):
        batch = decode(read_record(str(tmp_path / "run" / "batches" / f"step_{step:08d}.rec")))
        assert max(int(p) for p in batch.prompt_lens) <= 8


def test_resume_refuses_changed_training_prompts(tmp_path):
    """The checkpoint's cursor indexes the prompt stream: if the dataset's prompts changed, resuming
    would train some prompts twice and skip others, so it is exit 2; the same prompts in a file
    moved elsewhere resume."""
    data = write_jsonl(tmp_path / "d.jsonl", digit_rows())
    args = [f"task.dataset={data}", "task.reward=digits", "run.total_steps=4", "run.checkpoint_every=2"]
    first = launch(tmp_path, *args)
    assert first.returncode == 0, first.stderr[-2000:]
    moved = write_jsonl(tmp_path / "moved.jsonl", digit_rows())       # same prompts, moved
    again = launch(tmp_path, f"task.dataset={moved}", *args[1:-2], "run.total_steps=6",
                   "run.checkpoint_every=2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r["step"] for r in steps(tmp_path / "run")] == list(range(1, 7))
    write_jsonl(data, digit_rows()[::-1])                              # same rows, another order
    changed = launch(tmp_path, *args[:-2], "run.total_steps=8")
    assert changed.returncode == 2
    line = changed.stderr.strip().splitlines()[-1]
    assert "training prompts changed" in line and "step_00000006" in line, line
