"""The agent endpoint against what agent frameworks send (issue #38 item 7): one real launch of the
built-in `lookup` task whose agent (a plain function, one pooled `openai.OpenAI` client per
process) plays each episode in one of four ways, every call through the `openai` client:
- `stream`: chat completions with `stream=True` (`stream_options.include_usage`, logprobs, token
  ids), the streamed turn sent back as its joined content, then a second call;
- `responses`: `client.responses.create` (instructions, input items, the output items sent back);
- `fork`: two concurrent calls with the same messages (a fan-out), each continued on its own branch;
- `completions`: `/v1/completions` with `stream=True`, then a prompt of token ids extending it.
Checked on that run: every trained sample is, token by token, the last prompt + sampled ids one
branch of one episode was given (streamed ids included), its loss-masked runs the sampled ids with
their logprobs; each forked episode is trained as two sequences with its reward (the step line's
`branches`, the batch holds 16 + branches samples, the audit passes); streamed chunks end with the
usage and `data: [DONE]`; what the endpoint does not honour is refused with 400 naming the
parameter, and the sampling knobs it overrides are named in `x-arl-overridden`."""
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
import json, os, threading
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")
import httpx, openai
from openai import OpenAI

LOG, KEYS = {log!r}, {keys!r}
HTTP = httpx.Client(timeout=60)            # one pool per process, shared by every episode's client
WAYS = ("stream", "responses", "fork", "completions")


def _status(fn):
    try:
        fn()
    except openai.APIStatusError as exc:
        return [exc.status_code, exc.body.get("param") if isinstance(exc.body, dict) else None]
    return [200, None]


def chat(client, msgs, **kw):
    r = client.chat.completions.create(model="policy", messages=msgs, logprobs=True,
                                       extra_body={{"return_token_ids": True}}, **kw)
    c = r.choices[0]
    return c.message.content, {{"prompt": r.prompt_token_ids, "ids": c.token_ids,
                               "logprobs": [t.logprob for t in c.logprobs.content]}}


def streamed(client, msgs):
    chunks = list(client.chat.completions.create(
        model="policy", messages=msgs, logprobs=True, stream=True,
        stream_options={{"include_usage": True}}, extra_body={{"return_token_ids": True}}))
    body = [c for c in chunks if c.choices]
    ids = [t for c in body for t in (c.choices[0].model_extra or {{}}).get("token_ids") or []]
    lps = [t.logprob for c in body if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in body)
    return text, {{"prompt": body[0].model_extra["prompt_token_ids"], "ids": ids, "logprobs": lps,
                  "usage": chunks[-1].usage.model_dump() if chunks[-1].usage else None,
                  "finish": body[-1].choices[0].finish_reason, "last_has_choices": bool(chunks[-1].choices)}}


def run(row, base_url, api_key):
    n = len(os.listdir(KEYS))
    open(os.path.join(KEYS, api_key), "w").close()
    way = WAYS[n % 4]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=HTTP)
    msgs = [{{"role": "user", "content": row["prompt"]}}]
    rec = {{"way": way, "branches": [], "refused": {{}}}}
    if n < 4:          # the refusals, on a few episodes (none costs a turn)
        rec["refused"] = {{
            "tool_choice": _status(lambda: client.chat.completions.create(
                model="policy", messages=msgs, tool_choice="required")),
            "response_format": _status(lambda: client.chat.completions.create(
                model="policy", messages=msgs, response_format={{"type": "json_object"}})),
            "stream": _status(lambda: client.responses.create(model="policy", input="1>", stream=True)),
            "previous_response_id": _status(lambda: client.responses.create(
                model="policy", input="1>", previous_response_id="resp_x"))}}
    if way == "stream":
        text, call = streamed(client, msgs)
        raw = client.chat.completions.with_raw_response.create(
            model="policy", messages=msgs + [{{"role": "assistant", "content": text}},
                                             {{"role": "tool", "content": "=83>"}}],
            temperature=0.25, seed=7, logprobs=True, extra_body={{"return_token_ids": True}})
        rec["overridden"] = raw.headers.get("x-arl-overridden")
        r = raw.parse()
        c = r.choices[0]
        second = {{"prompt": r.prompt_token_ids, "ids": c.token_ids,
                   "logprobs": [t.logprob for t in c.logprobs.content]}}
        # the same again on the wire: the server-sent events as bytes
        body = {{"model": "policy", "stream": True, "logprobs": True, "return_token_ids": True,
                 "messages": msgs + [{{"role": "assistant", "content": text}}, {{"role": "tool", "content": "=83>"}},
                                     {{"role": "assistant", "content": c.message.content}},
                                     {{"role": "tool", "content": "=83>"}}]}}
        with HTTP.stream("POST", base_url + "/chat/completions", json=body,
                         headers={{"Authorization": "Bearer " + api_key}}) as resp:
            events = [x for x in resp.read().decode().split("\\n\\n") if x]
        rec["events_tail"] = events[-1]
        chunks = [json.loads(x[len("data: "):]) for x in events[:-1]]
        third = {{"prompt": chunks[0]["prompt_token_ids"],
                  "ids": [t for x in chunks for t in x["choices"][0]["token_ids"]],
                  "logprobs": [t["logprob"] for x in chunks if x["choices"][0]["logprobs"]
                               for t in x["choices"][0]["logprobs"]["content"]]}}
        rec["branches"].append([call, second, third])
    elif way == "responses":
        kw = dict(model="policy", instructions="- ", include=["message.output_text.logprobs"],
                  extra_body={{"return_token_ids": True}})
        r1 = client.responses.create(input=row["prompt"], **kw)
        items = [{{"role": "user", "content": row["prompt"]}}] + [o.model_dump(exclude_none=True) for o in r1.output]
        r2 = client.responses.create(input=items + [{{"role": "user", "content": "=83>"}}], **kw)
        rec["branches"].append([{{"prompt": r.model_extra["prompt_token_ids"], "ids": r.model_extra["token_ids"],
                                 "logprobs": [t.logprob for t in r.output[0].content[0].logprobs],
                                 "text": r.output_text, "status": r.status}} for r in (r1, r2)])
    elif way == "fork":
        out = [None, None]

        def one(i):
            text, call = chat(client, msgs)
            text2, call2 = chat(client, msgs + [{{"role": "assistant", "content": text}},
                                                {{"role": "tool", "content": "=%d>" % i}}])
            out[i] = [call, call2]
        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        rec["branches"] = out
    else:
        chunks = list(client.completions.create(model="policy", prompt=row["prompt"], stream=True,
                                                logprobs=0, extra_body={{"return_token_ids": True}}))
        ids = [t for c in chunks for t in c.choices[0].model_extra.get("token_ids") or []]
        first = {{"prompt": chunks[0].choices[0].model_extra["prompt_token_ids"], "ids": ids,
                  "logprobs": [x for c in chunks for x in c.choices[0].logprobs.token_logprobs]}}
        prompt = first["prompt"] + ids + [15, 11, 6, 16]                    # "=83>"
        r = client.completions.create(model="policy", prompt=prompt, logprobs=0,
                                      extra_body={{"return_token_ids": True}})
        c = r.choices[0]
        rec["branches"].append([first, {{"prompt": c.model_extra["prompt_token_ids"], "ids": c.model_extra["token_ids"],
                                        "logprobs": c.logprobs.token_logprobs}}])
    rec["reward"] = reward = (hash(api_key) % 97) / 97.0
    with open(LOG, "a") as f:
        f.write(json.dumps(rec) + "\\n")
    return reward
'''


def _runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2], edges[1::2]))


@pytest.fixture(scope="module")
def frameworks_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frameworks")
    log, keys = tmp / "episodes.jsonl", tmp / "keys"
    keys.mkdir()
    (tmp / "agent.py").write_text(AGENT.format(log=str(log), keys=str(keys)))
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", f"run.dir={tmp / 'run'}", "run.progress=false",
         "run.checkpoint_every=0", "eval.every_steps=0", "task.name=lookup", "rollout.group_size=4",
         "rollout.consumer_batch_size=4", "rollout.max_concurrent_rollouts=8",
         "rollout.max_head_offpolicyness=1", "rollout.max_new_tokens=3", "rollout.filter_zero_std=false",
         "task.max_turns=4", "run.total_steps=3", f"task.agent={tmp / 'agent.py'}:run"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp / "run", [json.loads(line) for line in open(log)]


def test_every_way_of_calling_trains_exactly_the_sampled_ids(frameworks_run):
    from orchestrator.run.durable import read_record
    from shm.codec import decode

    run_dir, recs = frameworks_run
    assert {r["way"] for r in recs} == {"stream", "responses", "fork", "completions"}
    by_ids: dict = {}
    for rec in recs:
        for branch in rec["branches"]:
            last = branch[-1]
            by_ids.setdefault(tuple(last["prompt"] + last["ids"]), []).append((rec, branch))
    for step, line in enumerate(steps(run_dir), 1):
        b = decode(read_record(str(run_dir / "batches" / f"step_{step:08d}.rec")))
        assert b.n == 16 + line["branches"] and line["rollouts_rejected"] == 0
        forks = 0
        for i in range(b.n):
            sl = b.seq(i)
            tokens, mask = b.tokens[sl], b.loss_mask[sl].astype(bool)
            cands = [(rec, branch) for rec, branch in by_ids.get(tuple(tokens.tolist()), ())
                     if np.isclose(rec["reward"], b.rewards[i])
                     and [tokens[a:z].tolist() for a, z in _runs(mask)] == [c["ids"] for c in branch]
                     and np.allclose(b.logprobs[sl][mask], [x for c in branch for x in c["logprobs"]], atol=1e-5)]
            assert cands, f"step {step} sample {i}: not the ids, runs and logprobs one branch of an agent was given"
            rec, branch = cands[0]
            forks += rec["way"] == "fork"
            assert b.prompt_lens[i] == len(branch[0]["prompt"])
        assert line["branches"] == forks // 2          # each forked episode: two sequences
    assert sum(line["branches"] for line in steps(run_dir)) > 0
    audit = subprocess.run([sys.executable, "-m", "orchestrator.audit", str(run_dir)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert json.loads(audit.stdout)["ok"], audit.stdout


def test_streams_end_with_usage_and_refusals_name_the_parameter(frameworks_run):
    _, recs = frameworks_run
    streams = [r for r in recs if r["way"] == "stream"]
    for rec in streams:
        first = rec["branches"][0][0]
        assert first["usage"] == {"prompt_tokens": len(first["prompt"]), "completion_tokens": len(first["ids"]),
                                  "total_tokens": len(first["prompt"]) + len(first["ids"])} | \
            {k: v for k, v in first["usage"].items() if k.endswith("_details")}
        assert not first["last_has_choices"] and first["finish"] in ("stop", "length")
        assert "temperature=0.25->1.0" in rec["overridden"] and "seed=7->" in rec["overridden"]
        assert rec["events_tail"] == "data: [DONE]"
    for rec in [r for r in recs if r["way"] == "responses"]:
        assert all(c["status"] in ("completed", "incomplete") for c in rec["branches"][0])
    refused = [r["refused"] for r in recs if r["refused"]]
    assert refused
    for got in refused:
        assert got == {"tool_choice": [400, "tool_choice"], "response_format": [400, "response_format"],
                       "stream": [400, "stream"], "previous_response_id": [400, "previous_response_id"]}

