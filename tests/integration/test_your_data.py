"""Your model, your data, your reward, through `python -m orchestrator.launch`: a real HF model
directory (tests/hf_model.py: BPE tokenizer, chat template, two eos ids in its generation config),
a JSONL dataset of chat messages and a reward function in a file, both written here. The run
trains; every trained reward is the user's function of (text, row, ids); prompts are the model's
chat template rendering; samples stop at the generation config's eos ids; the eval line reports
accuracy over eval.samples_per_prompt samples; `python -m orchestrator.export` writes an `hf/` that
transformers loads (tied embeddings tied) and generates with, holding the trained weights."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.integration.lifecycle import ROOT, steps

pytest.importorskip("datasets")
torch = pytest.importorskip("torch")

REWARD = '''
def score(completion, row, ids):
    """Deterministic in what it is given: the row's weight times a function of ids and text."""
    assert isinstance(completion, str) and isinstance(ids, list)
    return row["weight"] * ((len(ids) + len(completion)) % 5) / 4
'''
WORDS = ["copy", "the", "digits", "answer", "reason", "step", "then", "stop"]


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def chat_rows(n, seed):
    rng = np.random.default_rng(seed)
    return [{"messages": [{"role": "user", "content": " ".join(rng.choice(WORDS, 3)) + f" {i}"}],
             "answer": str(i), "weight": float(1 + i % 3)} for i in range(n)]


def launch(*args, cwd=ROOT):
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "orchestrator.launch", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})


def test_user_model_data_and_reward_end_to_end(hf_model_dir, tmp_path, monkeypatch):
    from orchestrator.config import load_config
    from orchestrator.data.workload import load_prompts
    from orchestrator.run.durable import read_record
    from shm.codec import decode

    write_jsonl(tmp_path / "train.jsonl", chat_rows(40, 0))
    write_jsonl(tmp_path / "test.jsonl", chat_rows(6, 1))
    (tmp_path / "my_reward.py").write_text(REWARD)
    run_dir = tmp_path / "run"
    args = ["--config", str(ROOT / "configs/default.yaml"), f"run.dir={run_dir}",
            "run.total_steps=6", "run.checkpoint_every=3", "run.progress=false",
            f"model.path={hf_model_dir}", "task.name=dataset",
            f"task.dataset={tmp_path / 'train.jsonl'}", f"task.eval_dataset={tmp_path / 'test.jsonl'}",
            "task.prompt_field=messages", "task.reward=my_reward.py:score",
            "task.system_prompt=Be brief.", "rollout.max_new_tokens=6", "rollout.group_size=4",
            "rollout.consumer_batch_size=4", "rollout.filter_zero_std=false",
            "eval.every_steps=3", "eval.samples_per_prompt=2"]
    out = launch(*args, cwd=tmp_path)             # the reward file is relative to the cwd
    assert out.returncode == 0, out.stderr[-3000:]
    lines = steps(run_dir)
    assert [r["step"] for r in lines] == list(range(1, 7))
    assert all(r["reward_errors"] == 0 for r in lines)

    cfg = load_config(ROOT / "configs/default.yaml", args[3:])
    monkeypatch.chdir(tmp_path)
    prompts = load_prompts(cfg)
    tok = prompts.renderer.tok
    rows = [json.loads(x) for x in open(tmp_path / "train.jsonl")]
    stops = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    for step in range(1, 7):
        batch = decode(read_record(str(run_dir / "batches" / f"step_{step:08d}.rec")))
        for i in range(batch.n):
            sl, p = batch.seq(i), int(batch.prompt_lens[i])
            row = rows[prompts.train_row(int(batch.prompt_ids[i]))]
            prompt, completion = batch.tokens[sl][:p], [int(t) for t in batch.tokens[sl][p:]]
            text = tok.decode(prompt)
            assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                            f"{row['messages'][0]['content']}<|im_end|>\n<|im_start|>assistant\n")
            assert prompt.tolist() == prompts.renderer.ids(row["messages"]).tolist()
            assert not any(t in stops for t in completion[:-1])      # stops end a sample
            body = completion[:-1] if completion[-1] in stops else completion
            want = row["weight"] * ((len(completion) + len(tok.decode(body, skip_special_tokens=True)))
                                    % 5) / 4
            assert batch.rewards[i] == pytest.approx(want), (step, i)
    evals = [json.loads(x) for x in open(run_dir / "metrics.jsonl") if '"eval"' in x]
    assert [e["step"] for e in evals] == [3, 6]
    assert all(e["prompts"] == 6 and e["samples"] == 12 and 0 <= e["accuracy"] <= 1 for e in evals)

    # export: the newest checkpoint's hf/ loads with transformers and generates
    export = subprocess.run([sys.executable, "-m", "orchestrator.export", str(run_dir),
                             str(tmp_path / "exported")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert export.returncode == 0, export.stderr
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", local_files_only=True)
    etok = AutoTokenizer.from_pretrained(tmp_path / "exported", local_files_only=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert etok.chat_template == tok.chat_template and etok.get_vocab() == tok.get_vocab()
    assert set(model.generation_config.eos_token_id) == stops
    trained = load_file(run_dir / "checkpoints" / "step_00000006" / "trainer" / "hf" / "model.safetensors")
    initial = AutoModelForCausalLM.from_pretrained(hf_model_dir, local_files_only=True).state_dict()
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in trained.items())
    assert any(not torch.equal(initial[k], v) for k, v in trained.items())     # it trained
    ids = etok.apply_chat_template([{"role": "user", "content": "copy the digits"}],
                                   add_generation_prompt=True, return_tensors="pt", return_dict=True)
    gen = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]

    step3 = tmp_path / "at3"
    assert subprocess.run([sys.executable, "-m", "orchestrator.export", str(run_dir), "--step", "3",
                           str(step3)], cwd=ROOT, capture_output=True, timeout=120).returncode == 0
    assert (step3 / "config.json").exists() and (step3 / "tokenizer.json").exists()


def test_your_data_page_command_runs_as_pasted(hf_model_dir, tmp_path):
    """The your-data page's command for your own HF model, on top of the embedded default job (its
    task.name=copy2 and eval.every_steps=200): your data replaces the built-in task, and eval
    without an eval set is off with one warning line instead of exit 2."""
    page = (ROOT / "docs" / "your-data.md").read_text()
    line = next(l for l in page.splitlines()
                if l.startswith("python -m orchestrator.launch model.path="))
    rows = [{"question": f"What is {i} plus {i}? Answer after ####.", "answer": f"#### {2 * i}"}
            for i in range(12)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    args = []
    for arg in line.split()[3:]:
        key, _, _ = arg.partition("=")
        args.append({"model.path": f"model.path={hf_model_dir}",
                     "task.dataset": f"task.dataset={tmp_path / 'train.jsonl'}",
                     "run.dir": f"run.dir={tmp_path / 'run'}"}.get(key, arg))
    assert [a.partition("=")[0] for a in args][:4] == ["model.path", "task.dataset",
                                                       "task.prompt_field", "task.reward"]
    out = launch(*args, "run.total_steps=2", "run.progress=false")
    assert out.returncode == 0, out.stderr[-3000:]
    warnings = [l for l in out.stderr.splitlines() if l.startswith("warning:")]
    assert warnings == ["warning: eval.every_steps=200 with task.dataset and no task.eval_dataset: "
                        "eval is off (set task.eval_dataset to evaluate)"]
    assert [r["step"] for r in steps(tmp_path / "run")] == [1, 2]
    resolved = (tmp_path / "run" / "config.yaml").read_text()
    assert "name: dataset" in resolved and "copy2" not in resolved
    both = launch(*args, "task.name=copy2", "run.total_steps=2")          # both named: still a clash
    assert both.returncode == 2 and "task.name='copy2' and task.dataset are exclusive" in both.stderr
