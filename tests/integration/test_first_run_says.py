"""A first run says what it decided for the user (#38 items 1, 3, 4), through real launches on data
written here:
- plain-string prompts with a tokenizer that has a chat template are rendered with it
  (`task.apply_chat_template=auto`), said in a `note:` line at start and kept resolved in
  config.yaml; the trained prompt ids are the template's rendering;
- `eval.every_steps` past `run.total_steps` runs one eval round at the last step, said at start;
- characters the built-in tokenizer has no token for are exit 2 naming the row and the characters
  (`task.unknown_chars=error`, the default), or one warning with the count (`warn`)."""
import json

import pytest
import yaml

from tests.integration.lifecycle import ROOT, error_lines, steps
from tests.integration.test_your_data import launch, write_jsonl

pytest.importorskip("datasets")
pytest.importorskip("torch")

SHORT = ["run.total_steps=2", "run.checkpoint_every=2", "run.progress=false",
         "rollout.max_new_tokens=4", "rollout.group_size=2", "rollout.consumer_batch_size=2",
         "rollout.filter_zero_std=false"]
WORDS = ["copy", "the", "digits", "answer", "reason", "step", "then", "stop"]


def _records(run_dir):
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def test_plain_strings_use_the_template_and_a_late_eval_runs_at_the_last_step(hf_model_dir, tmp_path):
    from orchestrator.run.durable import read_record
    from shm.codec import decode
    from transformers import AutoTokenizer

    rows = [{"prompt": f"{WORDS[i % 8]} {WORDS[(3 * i) % 8]} {i}", "answer": str(i)}
            for i in range(12)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "test.jsonl", rows[:3])
    run_dir = tmp_path / "run"
    out = launch("--config", str(ROOT / "configs/default.yaml"), f"run.dir={run_dir}", *SHORT,
                 f"model.path={hf_model_dir}", "task.name=dataset",
                 f"task.dataset={tmp_path / 'train.jsonl'}",
                 f"task.eval_dataset={tmp_path / 'test.jsonl'}", "task.reward=exact_match",
                 "eval.every_steps=50", "eval.samples_per_prompt=1")
    assert out.returncode == 0, out.stderr[-3000:]
    notes = [line for line in out.stderr.splitlines() if line.startswith("note: ")]
    assert any("task.apply_chat_template=auto" in n and "chat template" in n for n in notes), notes
    assert any("eval.every_steps=50" in n and "step 2" in n for n in notes), notes
    resolved = yaml.safe_load(open(run_dir / "config.yaml"))
    assert resolved["task"]["apply_chat_template"] is True
    evals = [r for r in _records(run_dir) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2]
    assert [r["step"] for r in steps(run_dir)] == [1, 2]

    tok = AutoTokenizer.from_pretrained(hf_model_dir)
    batch = decode(read_record(str(run_dir / "batches" / "step_00000001.rec")))
    for i in range(batch.n):                # shuffled rows: find each sample's row by its text
        text = tok.decode(batch.tokens[batch.seq(i)][:int(batch.prompt_lens[i])])
        assert any(text == tok.apply_chat_template([{"role": "user", "content": r["prompt"]}],
                                                   tokenize=False, add_generation_prompt=True)
                   for r in rows), text


def _letters(tmp_path, n=10):
    rows = [{"prompt": f"{i}{i}", "answer": f"{i}{i}"} for i in range(n)]
    rows[3] = {"prompt": "add 3+4", "answer": "7"}                    # reasoning-gym-like letters
    rows[7] = {"prompt": "x=5", "answer": "5"}
    write_jsonl(tmp_path / "train.jsonl", rows)
    return ["--config", str(ROOT / "configs/default.yaml"), "task.name=dataset",
            f"task.dataset={tmp_path / 'train.jsonl'}", "task.reward=exact_match", "eval.every_steps=0"]


def test_characters_without_a_token_are_exit_2_naming_the_row(tmp_path):
    out = launch(*_letters(tmp_path), f"run.dir={tmp_path / 'run'}", *SHORT)
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = error_lines(out.stderr)
    assert "task.dataset row 3" in line and "'a', 'd'" in line and "task.unknown_chars" in line, line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_characters_without_a_token_warned_once_with_the_count(tmp_path):
    run_dir = tmp_path / "run"
    out = launch(*_letters(tmp_path), f"run.dir={run_dir}", *SHORT, "task.unknown_chars=warn")
    assert out.returncode == 0, out.stderr[-2000:]
    warned = [line for line in out.stderr.splitlines() if "no token for" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: 2 prompts"), warned
    assert "'a', 'd', 'x'" in warned[0]
    assert [r["step"] for r in steps(run_dir)] == [1, 2]
