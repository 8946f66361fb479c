"""Agents over HTTP end to end (`task.agent`, issue #26): one real launch (supervisor, inference and
trainer workers, the worker's aiohttp endpoint) of the built-in `lookup` task where each episode is
an agent written with the `openai` client (plain function, sync client): it calls the model, answers
a tool call ("|") with the tool's reply ("=83>"), gets the answer, and scores it as the in-process
environment does. Checked on that one run:
- every step line carries the agents' rewards (its reward_mean is the mean of the rewards the
  agents returned for the samples of its batch);
- the trainer sees exactly the sampled ids: every trained sample is, token by token, the last
  call's prompt ids + its sampled ids as the endpoint returned them, its loss-masked runs are the
  calls' sampled ids with the logprobs the endpoint reported and live, non-decreasing versions;
- bad requests get 4xx OpenAI-style error bodies while the run goes on: malformed JSON (400),
  an unknown model (404), a wrong key (401), another live episode's key (403), a huge `max_tokens`
  (400), none of which costs a turn;
and a bad `task.agent` is exit 2 in one line before anything starts."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.integration.lifecycle import ROOT, steps

pytest.importorskip("torch")
pytest.importorskip("openai")
pytest.importorskip("aiohttp")

AGENT = '''
import json, os, random, urllib.error, urllib.request
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")   # openai's models built at import: their
from openai import OpenAI                                 # deferred build is not thread-safe

LOG, KEYS = {log!r}, {keys!r}


def _raw(url, key, body):
    req = urllib.request.Request(url + "/chat/completions", data=body, method="POST",
                                 headers={{"Authorization": "Bearer " + key}})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def run(row, base_url, api_key):
    rec = {{"key": api_key, "calls": [], "bad": {{}}}}
    others = os.listdir(KEYS)
    open(os.path.join(KEYS, api_key), "w").close()
    msgs = [{{"role": "user", "content": row["prompt"]}}]
    ok = json.dumps({{"model": "policy", "messages": msgs}}).encode()
    rec["bad"]["malformed"] = _raw(base_url, api_key, b'{{"model": "policy", "messages": ')
    rec["bad"]["unknown_model"] = _raw(base_url, api_key, json.dumps({{"model": "gpt-x", "messages": msgs}}).encode())
    rec["bad"]["wrong_key"] = _raw(base_url, "sk-not-mine", ok)
    rec["bad"]["huge_max_tokens"] = _raw(base_url, api_key, json.dumps(
        {{"model": "policy", "messages": msgs, "max_tokens": 10 ** 7}}).encode())
    if others:
        rec["bad"]["other_key"] = _raw(base_url, others[-1], ok)
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)

    def call():
        r = client.chat.completions.create(model="policy", messages=msgs, logprobs=True,
                                           extra_body={{"return_token_ids": True}})
        c = r.choices[0]
        rec["calls"].append({{"prompt": r.prompt_token_ids, "ids": c.token_ids,
                              "logprobs": [t.logprob for t in c.logprobs.content],
                              "finish": c.finish_reason}})
        return c
    first = call()
    reward = 0.0
    # the tool call; and every third episode whatever the model said (an untrained model starts
    # with "|" about 1 time in 20: a 4-step run can miss it), so some episodes always take 2 calls
    if first.message.content.startswith("|") or len(others) % 3 == 0:
        value = "%02d" % random.randrange(100)
        msgs += [first.message, {{"role": "tool", "content": "=" + value + ">"}}]
        answer = call()
        text = answer.message.content
        if not text.startswith("|"):
            right = sum(a == b for a, b in zip(text[:2], value)) + (len(text) == 2 and answer.finish_reason == "stop")
            clean = first.message.content == "|" and first.finish_reason == "stop"
            reward = 0.1 + 0.1 * clean + 0.8 * right / 3
    rec["reward"] = reward
    with open(LOG, "a") as f:
        f.write(json.dumps(rec) + "\\n")
    return reward
'''


def _launch(tmp_path, *overrides, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp_path / 'run'}", "run.progress=false",
         "run.checkpoint_every=0", "eval.every_steps=0", "task.name=lookup", "rollout.group_size=4",
         "rollout.consumer_batch_size=4", "rollout.max_concurrent_rollouts=8",
         "rollout.max_head_offpolicyness=1", "rollout.max_new_tokens=3", "rollout.filter_zero_std=false",
         "task.max_turns=3", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2], edges[1::2]))


def test_an_openai_client_agent_trains_on_exactly_its_sampled_ids(tmp_path):
    from orchestrator.run.durable import read_record
    from shm.codec import decode

    log, keys = tmp_path / "episodes.jsonl", tmp_path / "keys"
    keys.mkdir()
    (tmp_path / "lookup_agent.py").write_text(AGENT.format(log=str(log), keys=str(keys)))
    out = _launch(tmp_path, "run.total_steps=4", f"task.agent={tmp_path / 'lookup_agent.py'}:run")
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [json.loads(line) for line in open(log)]
    by_ids: dict = {}
    for rec in recs:
        last = rec["calls"][-1]
        by_ids.setdefault(tuple(last["prompt"] + last["ids"]), []).append(rec)
    lines = steps(tmp_path / "run")
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    for step, line in enumerate(lines, 1):
        b = decode(read_record(str(tmp_path / "run" / "batches" / f"step_{step:08d}.rec")))
        assert b.n == 16
        rewards = []
        for i in range(b.n):
            sl = b.seq(i)
            tokens, mask = b.tokens[sl], b.loss_mask[sl].astype(bool)
            cands = by_ids.get(tuple(tokens.tolist()))
            assert cands, f"step {step} sample {i}: not the ids an agent was given"
            rec = next((r for r in cands if np.isclose(r["reward"], b.rewards[i])), None)
            assert rec is not None, (b.rewards[i], [r["reward"] for r in cands])
            calls = rec["calls"]
            assert [tokens[a:z].tolist() for a, z in _runs(mask)] == [c["ids"] for c in calls]
            assert b.logprobs[sl][mask] == pytest.approx([x for c in calls for x in c["logprobs"]], abs=1e-6)
            live = b.versions[sl][mask]
            assert (live >= 0).all() and (np.diff(live) >= 0).all() and (b.versions[sl][~mask] == -1).all()
            assert b.prompt_lens[i] == len(calls[0]["prompt"])
            rewards.append(rec["reward"])
        assert line["reward_mean"] == pytest.approx(np.mean(rewards), abs=1e-6)
        assert line["trainable"] == 16 and line["rollouts_rejected"] == 0
    assert any(len(r["calls"]) == 2 for r in recs)             # tool calls answered
    for rec in recs:
        bad = rec["bad"]
        for name, status, code in [("malformed", 400, "malformed_json"), ("unknown_model", 404, "model_not_found"),
                                   ("wrong_key", 401, "invalid_api_key"),
                                   ("huge_max_tokens", 400, "context_length_exceeded")]:
            assert bad[name][0] == status and bad[name][1]["error"]["code"] == code, (name, bad[name])
            assert set(bad[name][1]["error"]) >= {"message", "type", "code"}
        if "other_key" in bad:            # another episode's key: never served
            assert bad["other_key"][0] in (401, 403), bad["other_key"]
    assert sum(r["bad"].get("other_key", [0])[0] == 403 for r in recs) > 0


@pytest.mark.parametrize("spec, needle", [
    ("missing.py:run", "no such file"),
    ("lookup_agent.py:nope", "has no function 'nope'"),
    ("lookup_agent.py:NOT_CALLABLE", "is not a function"),
    ("lookup_agent.py:two_args", "cannot be called as run(row, base_url, api_key)"),
    ("norun", "not 'file.py:run' or 'module:run'"),
])
def test_a_bad_agent_is_exit_2_before_anything_starts(tmp_path, launch_main, spec, needle):
    (tmp_path / "lookup_agent.py").write_text("NOT_CALLABLE = 3\ndef two_args(row, url):\n    return 0\n")
    code, err = launch_main(f"run.dir={tmp_path / 'run'}", "task.name=lookup", f"task.agent={spec}",
                            "eval.every_steps=0", cwd=tmp_path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "task.agent" in lines[0], err
    assert not (tmp_path / "run").exists()


def test_a_bad_agent_process_exits_2_with_one_line(tmp_path):
    """The process-level contract once: exit 2, one error line naming task.agent, no traceback."""
    (tmp_path / "agent.py").write_text("def run(row):\n    return 0\n")
    out = _launch(tmp_path, f"task.agent={tmp_path / 'agent.py'}:run", timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(errors) == 1 and "task.agent" in errors[0] and "run(row, base_url, api_key)" in errors[0], out.stderr
    assert not (tmp_path / "run").exists()
