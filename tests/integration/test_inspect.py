"""`python -m orchestrator.inspect`: a trained batch, decoded, checked against the batch file itself.

Real runs (the session fixtures `sim_run_dir`, `torch_run_dir`, read-only) for what the loop writes;
a synthetic batch written into a copy of a run for what real short runs never hold (versions that
span several policies, a loss mask with a gap, a sample that is not live, head ages that differ).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from orchestrator.run.durable import read_record, write_record
from shm.codec import Sequences, decode, encode
from tests.integration.lifecycle import call_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def inspect(*args):
    """The tool called in this process (`call_main`); `test_the_process_...` runs it as a process."""
    from orchestrator.observe.inspect import main
    return call_main(main, *args)


def inspect_process(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator.inspect", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def batch_file(run_dir, step):
    return os.path.join(run_dir, "batches", f"step_{step:08d}.rec")


def read_batch(run_dir, step):
    return decode(read_record(batch_file(run_dir, step)))


def steps_of(run_dir):
    return sorted(int(n[5:13]) for n in os.listdir(os.path.join(run_dir, "batches"))
                  if re.fullmatch(r"step_\d{8}\.rec", n))


def jsonl(*args):
    out = inspect(*args, "--jsonl")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def one_error_line(out):
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    return lines[0]


def expected_sample(b, i):
    """What the tool must report for sample i, computed here from the raw columns."""
    s, p = b.seq(i), int(b.prompt_lens[i])
    mask = b.loss_mask[s].astype(bool)
    v = b.versions[s][mask].tolist()
    live = bool(v) and min(v) >= 0
    return {"prompt_id": int(b.prompt_ids[i]), "reward": float(b.rewards[i]),
            "advantage": float(b.advantages[i]), "prompt_tokens": b.tokens[s][:p].tolist(),
            "completion_tokens": b.tokens[s][p:].tolist(), "loss_mask": b.loss_mask[s][p:].tolist(),
            "versions": v, "live": live, "head": min(v) if live else None,
            "tail": max(v) if live else None, "age": b.version - min(v) if live else None}


def check_against_batch(rows, b):
    assert [r["index"] for r in rows] == list(range(b.n))
    for i, r in enumerate(rows):
        want = expected_sample(b, i)
        for key in ("prompt_id", "reward", "advantage", "prompt_tokens", "completion_tokens",
                    "loss_mask", "live", "head", "tail", "age"):
            assert r[key] == want[key], (i, key, r[key], want[key])
        assert r["completion_len"] == len(want["completion_tokens"])
        runs = r["version_runs"]
        assert [v for v, n in runs for _ in range(n)] == (want["versions"] if want["live"] else [])
        assert all(a[0] != c[0] for a, c in zip(runs, runs[1:])), runs     # maximal runs
        lp = b.logprobs[b.seq(i)][int(b.prompt_lens[i]):]
        np.testing.assert_allclose(r["logprobs"], lp, rtol=0, atol=1e-7)


def test_jsonl_sim_run_is_the_batch_with_ids(sim_run_dir):
    for step in (1, steps_of(sim_run_dir)[-1]):
        b = read_batch(sim_run_dir, step)
        rows = jsonl(sim_run_dir, "--step", step)
        assert len(rows) == b.n > 0
        check_against_batch(rows, b)
        assert all(r["step"] == step for r in rows)
        assert all(r["prompt_text"] is None and r["completion_text"] is None for r in rows)


def test_jsonl_torch_run_decodes_with_the_runs_tokenizer(torch_run_dir):
    from orchestrator.config import load_config
    from orchestrator.data.tokens import load_tokens
    from orchestrator.data.tokens import VOCAB

    cfg = load_config(os.path.join(torch_run_dir, "config.yaml"))
    tokens = load_tokens(cfg.model.path)
    step = steps_of(torch_run_dir)[-1]
    b = read_batch(torch_run_dir, step)
    rows = jsonl(torch_run_dir, "--step", step)
    assert len(rows) == b.n > 0
    check_against_batch(rows, b)
    stopped = 0
    for r in rows:
        ids = r["completion_tokens"]
        assert r["completion_text"] == tokens.tokenizer.decode(ids, skip_special_tokens=False)
        assert r["completion_text"] == "".join(VOCAB[t] for t in ids)    # one char (or special) per id
        digits = "".join(VOCAB[t] for t in r["prompt_tokens"] if VOCAB[t].isdigit())
        assert ">" in r["prompt_text"] and len(digits) == 2 and f"{digits}>" in r["prompt_text"]
        if ids and ids[-1] in tokens.stop_ids:
            stopped += 1
            assert r["completion_text"].endswith("<eos>")                 # the eos stays visible
    assert stopped > 0


def test_worst_by_advantage_is_the_lowest_advantages(torch_run_dir):
    step = steps_of(torch_run_dir)[-1]
    b = read_batch(torch_run_dir, step)
    k = 5
    rows = jsonl(torch_run_dir, "--step", step, "--worst", k)
    assert len(rows) == k
    assert [r["advantage"] for r in rows] == sorted(float(a) for a in b.advantages)[:k]
    for r in rows:
        assert r["advantage"] == float(b.advantages[r["index"]])
        assert r["prompt_id"] == int(b.prompt_ids[r["index"]])


def test_human_output_names_every_sample_and_its_stamp(sim_run_dir, torch_run_dir):
    for run_dir in (sim_run_dir, torch_run_dir):
        step = steps_of(run_dir)[-1]
        b = read_batch(run_dir, step)
        out = inspect(run_dir, "--step", step)
        assert out.returncode == 0, out.stderr
        head = out.stdout.splitlines()[0]
        assert f"step {step}" in head and f"policy version {b.version}" in head
        assert f"samples {b.n}" in head
        for i in range(b.n):
            want = expected_sample(b, i)
            block = re.search(rf"^\[{i}\] prompt_id {want['prompt_id']} .*?(?=^\[|\Z)", out.stdout,
                              re.M | re.S)
            assert block, f"sample {i} missing"
            assert f"head {want['head']}, tail {want['tail']}" in block.group(0)
            assert f"head age {want['age']}" in block.group(0)


def test_the_process_prints_what_main_returns(sim_run_dir):
    step = steps_of(sim_run_dir)[-1]
    out = inspect_process(sim_run_dir, "--step", step, "--jsonl")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout == inspect(sim_run_dir, "--step", step, "--jsonl").stdout != ""


# ------------------------------------------------------- synthetic batch: spans, gaps, not live

def synthetic_run(tmp_path, sim_run_dir):
    """A copy of the sim run with an extra batch (step 1 + the last) that real short runs never
    produce. Returns (run dir, step, the batch)."""
    d = tmp_path / "run"
    shutil.copytree(sim_run_dir, d)
    step = steps_of(d)[-1] + 1
    seqs = [
        {"prompt": [5, 6], "completion": [7, 8, 9, 10], "versions": [step - 3, step - 3, step - 2,
                                                                      step - 1], "advantage": 0.5},
        {"prompt": [5], "completion": [11, 12], "versions": -1, "advantage": -2.0},
        {"prompt": [5, 7], "completion": [13, 14], "versions": [step - 6, step - 5], "advantage": 0.1},
        {"prompt": [8], "completion": [15, 16, 17], "versions": [step - 2, -1, step - 1],
         "advantage": 1.0},
    ]
    b = Sequences.build(kind=2, ident=step, version=step - 1,
                        seqs=[dict(s, prompt_id=100 + i, reward=float(i)) for i, s in enumerate(seqs)])
    b.loss_mask[b.seq(3)][2] = 0           # an environment reply between two model turns
    write_record(batch_file(d, step), encode(b))
    return d, step, read_batch(d, step)


def test_version_spans_gaps_and_not_live(tmp_path, sim_run_dir):
    d, step, b = synthetic_run(tmp_path, sim_run_dir)
    rows = jsonl(d, "--step", step)
    check_against_batch(rows, b)
    assert len(rows[0]["version_runs"]) == 3 and rows[0]["head"] != rows[0]["tail"]
    assert rows[1]["live"] is False and rows[1]["age"] is None
    assert rows[3]["loss_mask"] == [1, 0, 1]
    human = inspect(d, "--step", step)
    assert human.returncode == 0, human.stderr
    assert "not live" in human.stdout
    assert f"head {step - 3}, tail {step - 1}, spans v{step - 3} x 2 | v{step - 2} x 1 | " \
           f"v{step - 1} x 1" in human.stdout


def test_worst_by_age_is_the_oldest_heads(tmp_path, sim_run_dir):
    d, step, b = synthetic_run(tmp_path, sim_run_dir)
    want = [expected_sample(b, i) for i in range(b.n)]
    live = sorted((w["age"] for w in want if w["live"]), reverse=True)
    assert len(set(live)) == len(live) > 1                     # an order, not a tie
    for k in (2, b.n):
        rows = jsonl(d, "--step", step, "--worst", k, "--by", "age")
        assert len(rows) == k
        assert [r["age"] for r in rows] == (live + [None] * b.n)[:k]   # not live: last
        assert all(r["age"] == want[r["index"]]["age"] for r in rows)


# ----------------------------------------------------------------------------------- bad input

def test_missing_step_names_the_range(sim_run_dir):
    """Through a real process: exit status 2, one line on stderr, nothing on stdout."""
    steps = steps_of(sim_run_dir)
    line = one_error_line(inspect_process(sim_run_dir, "--step", steps[-1] + 7))
    assert f"step {steps[-1] + 7}" in line and f"{steps[0]}..{steps[-1]}" in line


def test_damaged_batch_is_one_line(tmp_path, sim_run_dir):
    d = tmp_path / "run"
    shutil.copytree(sim_run_dir, d)
    step = steps_of(d)[-1]
    path = batch_file(d, step)
    data = bytearray(open(path, "rb").read())
    mid = len(data) // 2
    data[mid:mid + 4] = bytes(x ^ 0xFF for x in data[mid:mid + 4])
    with open(path, "wb") as f:
        f.write(data)
    line = one_error_line(inspect(d, "--step", step))
    assert f"step_{step:08d}.rec" in line and "damaged" in line
    assert inspect(d, "--step", step - 1).returncode == 0        # the rest of the copy is intact


@pytest.mark.parametrize("args, says", [
    (["{tmp}/nowhere", "--step", "1"], "does not exist"),
    (["{tmp}", "--step", "1"], "no config.yaml"),
    (["{run}", "--step", "1", "--worst", "0"], "--worst"),
    (["{run}", "--step", "one"], "--step"),
])
def test_bad_input_is_one_line(tmp_path, sim_run_dir, args, says):
    line = one_error_line(inspect(*[a.format(tmp=tmp_path, run=sim_run_dir) for a in args]))
    assert says in line
