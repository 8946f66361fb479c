"""Agent episodes through the endpoint, in process: the real episode runner (environment thread,
asyncio loop), the real aiohttp endpoint on 127.0.0.1, agents written with the real `openai`
client (plain functions with `OpenAI`, async ones with `AsyncOpenAI`), and a scripted decode loop
in place of the backend. Checked:
- the trajectory is exactly the sampled ids (token by token, with their logprobs and versions)
  plus what the calls appended; the agent's reward, or `task.reward` over the transcript;
- an HF chat template with `tools`: a hermes tool call comes back as `tool_calls`, the agent's
  copy of the turn is matched and the template extends the trajectory;
- `/v1/completions`: a text prompt, then ids extending the trajectory; a text that does not
  extend it is rejected, a chat call in a completions episode refused;
- refusals (OpenAI error bodies, the run goes on): malformed JSON, unknown model, a wrong key,
  another live episode's key, `max_tokens` beyond the episode's budget, a rewritten conversation
  (the episode rejected, not trained), calls after the end;
- a client that disconnects mid-turn: the turn is aborted in the backend and taken back; a turn
  past task.env_timeout_s ends the episode; an agent past task.agent_timeout_s, one that raises,
  one that never calls, `task.max_turns`."""
import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from orchestrator.config import TaskConfig
from orchestrator.data.reward_pool import REWARD_ERRORS, BadEnvOutput
from orchestrator.data.tokens import load_tokens
from orchestrator.envs.base import LIMITED, REJECTED, TOOL_CALLS
from orchestrator.envs.render import TurnRenderer
from orchestrator.envs.runner import EpisodeRunner, Limits
from shm.codec import Sequences

pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")
from orchestrator.envs.agent import AgentEpisodes  # noqa: E402

TOKENS = load_tokens(None)
TOK = TOKENS.tokenizer
EOS = TOKENS.eos_id
SEEN: dict = {}


def ids(text, tok=TOK):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def runner(fn, tokens=TOKENS, reward=None, max_turns=4, max_new=3, budget=60, timeout_s=10.0,
           agent_timeout_s=20.0, on_error="fail"):
    rows = lambda is_eval, row: {"prompt": f"{row:02d}>", "answer": f"{row:02d}"}     # noqa: E731
    lim = Limits(max_turns, max_new, budget, timeout_s, on_error, workers=2)
    agent = AgentEpisodes(fn, lambda row: ids(row["prompt"], tokens.tokenizer), reward,
                          agent_timeout_s, 8, ("policy",))
    return EpisodeRunner(None, {}, TurnRenderer(tokens, TaskConfig()), tokens, rows, lim,
                         "agent.py:run", seed=0, agent=agent)


def drive(r, sample, version=lambda: 0, answer=lambda k: True, deadline_s=30.0):
    """The decode loop's part: answer turn k (in arrival order, over all the group's episodes) with
    `sample(k, turn)` when `answer(k)`; aborts recorded."""
    turns, aborts, out, end = [], [], [], time.monotonic() + deadline_s
    while not out and time.monotonic() < end:
        for t in r.requests():
            k = len(turns)
            turns.append(t)
            if answer(k):
                got, v = sample(k, t)[:t.max_new_tokens], version()
                r.turn_done(t.key, Sequences.build(0, t.key, v, [
                    {"prompt": list(t.ids), "completion": got, "logprobs": [-0.25 - k] * len(got),
                     "versions": v}]))
        aborts += r.aborts()
        out = r.ready()
        time.sleep(0.001)
    assert out, "no group finished"
    return out, turns, aborts


def lookup_agent(row, base_url, api_key):
    """The lookup protocol with the plain client: a call, the tool's reply, an answer."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20)
    msgs = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=msgs, logprobs=True,
                                           extra_body={"return_token_ids": True})
    msgs += [first.choices[0].message, {"role": "tool", "content": "=83>"}]
    second = client.chat.completions.create(model="policy", messages=msgs, logprobs=True,
                                            extra_body={"return_token_ids": True})
    SEEN.setdefault("calls", []).append((first.model_dump(), second.model_dump()))
    return 0.75 if second.choices[0].message.content == "83" else 0.25


def test_trajectory_is_the_calls_and_the_sampled_ids():
    SEEN.clear()
    r = runner(lookup_agent)
    r.start(7, prompt_id=5, row=4, n=2, is_eval=False, temperature=1.0)
    versions = iter(range(100))
    # each episode's first call gets "|" (the tool turn), its second "83": by the turn's own prompt,
    # not its arrival order, since one episode's second call may come before the other's first
    first_call = TOK("04>")["input_ids"]
    (g,), turns, aborts = drive(r, lambda k, t: ids("|" if t.ids.tolist() == first_call else "83")
                                + [EOS], version=lambda: next(versions))
    r.close()
    assert g.n == 2 and g.rewards.tolist() == [0.75, 0.75] and not aborts and len(turns) == 4
    for i, (first, second) in enumerate(SEEN["calls"]):
        # the second call's prompt is the first's prompt, its sampled ids, the tool reply
        assert second["prompt_token_ids"][:len(first["prompt_token_ids"])] == first["prompt_token_ids"]
        assert first["prompt_token_ids"] == TOK("04>")["input_ids"]
        full = second["prompt_token_ids"] + second["choices"][0]["token_ids"]
        lp = [c["logprob"] for r in (first, second) for c in r["choices"][0]["logprobs"]["content"]]
        match = [j for j in range(g.n) if g.tokens[g.seq(j)].tolist() == full
                 and g.logprobs[g.seq(j)][g.loss_mask[g.seq(j)].astype(bool)].tolist() == lp]
        assert match, "the trained ids are not the ids (and logprobs) the agent was given"
        sl = g.seq(match[0])
        mask, vers = g.loss_mask[sl], g.versions[sl]
        p = len(first["prompt_token_ids"])
        t1 = first["choices"][0]["token_ids"]
        assert mask.tolist() == [0] * p + [1] * len(t1) + [0] * 4 + [1] * 3
        live = vers[mask.astype(bool)]
        assert (np.diff(live) >= 0).all() and live[0] < live[-1]     # weights moved between turns
        assert first["choices"][0]["message"]["content"] == "|"
        assert first["choices"][0]["finish_reason"] == "stop"
    assert g.prompt_lens.tolist() == [4, 4]


BAD: dict = {}


def refusing_agent(row, base_url, api_key):
    """Every bad request once (recorded), then one good call; the run goes on."""
    def raw(path, data, key=api_key, url=base_url):
        req = urllib.request.Request(f"{url}/{path}", data=data, method="POST",
                                     headers={"Authorization": f"Bearer {key}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.load(resp), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc), dict(exc.headers)
    msgs = [{"role": "user", "content": row["prompt"]}]
    good = json.dumps({"model": "policy", "messages": msgs}).encode()
    got = {"malformed": raw("chat/completions", b'{"model": "policy", "messages": [')}
    got["unknown_model"] = raw("chat/completions", json.dumps({"model": "gpt-9", "messages": msgs}).encode())
    got["huge_max_tokens"] = raw("chat/completions", json.dumps(
        {"model": "policy", "messages": msgs, "max_tokens": 10 ** 6}).encode())
    got["wrong_key"] = raw("chat/completions", good, key="sk-nope")
    BAD["keys"].append(api_key)
    BAD["barrier"].wait(10)              # both episodes live, both keys known
    other = next(k for k in BAD["keys"] if k != api_key)
    got["other_key"] = raw("chat/completions", good, key=other)
    got["other_url"] = raw("chat/completions", good, url=base_url.replace(api_key, other))
    BAD["barrier"].wait(10)
    got["models"] = openai.OpenAI(base_url=base_url, api_key=api_key).models.list().model_dump()
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20)
    BAD.setdefault("events", []).append(("first", api_key))
    ok = client.chat.completions.create(model="policy", messages=msgs, extra_body={"return_token_ids": True})
    got["ok"] = ok.model_dump()
    # a rewritten conversation: the model's turn edited
    try:
        client.chat.completions.create(model="policy", messages=msgs + [
            {"role": "assistant", "content": "something else"}, {"role": "tool", "content": "=1>"}])
    except openai.BadRequestError as exc:
        got["rewritten"] = (exc.status_code, exc.body)
    try:
        client.chat.completions.create(model="policy", messages=msgs)
    except openai.BadRequestError as exc:
        got["after_end"] = (exc.status_code, exc.body)
    BAD.setdefault("got", []).append(got)
    return 1.0


def test_bad_requests_get_openai_errors_and_the_run_goes_on():
    BAD.clear()
    BAD.update(keys=[], barrier=threading.Barrier(2))
    r = runner(refusing_agent)
    r.start(1, prompt_id=1, row=3, n=2, is_eval=False, temperature=1.0)
    (g,), turns, _ = drive(r, lambda k, t: ids("|") + [EOS])
    r.close()
    assert len(BAD["got"]) == 2 and len(turns) == 2          # one turn each: every refusal cost none
    for got in BAD["got"]:
        for name, status, code in [("malformed", 400, "malformed_json"),
                                   ("unknown_model", 404, "model_not_found"),
                                   ("huge_max_tokens", 400, "context_length_exceeded"),
                                   ("wrong_key", 401, "invalid_api_key")]:
            st, body, headers = got[name]
            assert st == status and body["error"]["code"] == code, (name, body)
            assert body["error"]["message"] and body["error"]["type"]
            assert headers.get("x-should-retry") == "false"
        assert got["models"]["data"][0]["id"] == "policy"
        assert got["rewritten"][0] == 400 and got["rewritten"][1]["code"] == "rejected"
        assert got["after_end"][1]["code"] == "episode_ended"
    for got in BAD["got"]:               # another live episode's key: refused either way round
        assert got["other_key"][0] == 403 and got["other_key"][1]["error"]["type"] == "permission_error"
        assert got["other_url"][0] == 403
    # rejected: not trained, counted; the trajectory is the one good call's
    assert g.scalars[REJECTED] == 2 and not g.loss_mask.any() and (g.versions == -1).all()
    for got in BAD["got"]:
        full = got["ok"]["prompt_token_ids"] + got["ok"]["choices"][0]["token_ids"]
        assert full in [g.tokens[g.seq(j)].tolist() for j in range(g.n)]


@pytest.fixture(scope="module")
def hf_tokens(hf_model_dir):
    return load_tokens(str(hf_model_dir))


TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "the value of a key",
                                           "parameters": {"type": "object", "properties": {
                                               "key": {"type": "string"}}}}}]
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "47"}}\n</tool_call>'


async def tool_agent(row, base_url, api_key):
    """Async client, tools: the model's call is answered by the tool; the transcript is scored by
    task.reward (None returned)."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20) as c:
        msgs = [{"role": "user", "content": "what is 47?"}]
        r1 = await c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS,
                                             extra_body={"return_token_ids": True})
        m = r1.choices[0].message
        SEEN.setdefault("tool", []).append(r1.model_dump())
        msgs += [m] + [{"role": "tool", "tool_call_id": tc.id,
                        "content": json.loads(tc.function.arguments)["key"] + "=42"} for tc in m.tool_calls]
        r2 = await c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS,
                                             extra_body={"return_token_ids": True})
        SEEN["tool"].append(r2.model_dump())
    return None


def test_hermes_tool_call_through_a_chat_template(hf_tokens):
    SEEN.clear()
    tok = hf_tokens.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    scored = []

    def reward(text, row, completion_ids):
        scored.append((text, completion_ids))
        return 1.0 if text.endswith("42") else 0.0
    r = runner(tool_agent, tokens=hf_tokens, reward=reward, max_new=200, budget=1000)
    r.start(2, prompt_id=2, row=0, n=1, is_eval=False, temperature=1.0)
    (g,), turns, _ = drive(r, lambda k, t: ids(CALL if k == 0 else "the answer is 42", tok) + [end])
    r.close()
    first, second = SEEN["tool"]
    msg = first["choices"][0]["message"]
    assert first["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] is None
    assert msg["tool_calls"][0]["function"]["name"] == "lookup"
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"key": "47"}
    assert second["choices"][0]["message"]["content"] == "the answer is 42"
    assert g.scalars[REJECTED] == 0 and g.scalars[TOOL_CALLS] == 1 and g.rewards.tolist() == [1.0]
    full = second["prompt_token_ids"] + second["choices"][0]["token_ids"]
    assert g.tokens.tolist() == full
    runs = np.flatnonzero(g.loss_mask)
    assert g.tokens[runs].tolist() == first["choices"][0]["token_ids"] + second["choices"][0]["token_ids"]
    text = tok.decode(second["prompt_token_ids"], skip_special_tokens=False)
    assert CALL + "<|im_end|>" in text and "47=42" in text
    assert scored[0][1] == g.tokens[g.prompt_lens[0]:].tolist()


DISCONNECT: dict = {}


async def impatient_agent(row, base_url, api_key):
    """Gives up on its first call (a client timeout: the connection closes), then asks again."""
    msgs = [{"role": "user", "content": row["prompt"]}]
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=0.5) as c:
        try:
            await c.chat.completions.create(model="policy", messages=msgs)
        except openai.APITimeoutError:
            DISCONNECT["timed_out"] = True
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20) as c:
        r = await c.chat.completions.create(model="policy", messages=msgs, extra_body={"return_token_ids": True})
    DISCONNECT["ok"] = r.model_dump()
    return 0.5


def test_a_client_that_disconnects_aborts_its_turn():
    DISCONNECT.clear()
    r = runner(impatient_agent)
    r.start(3, prompt_id=3, row=5, n=1, is_eval=False, temperature=1.0)
    (g,), turns, aborts = drive(r, lambda k, t: ids("77") + [EOS], answer=lambda k: k > 0)
    r.close()
    assert DISCONNECT["timed_out"] and aborts == [turns[0].key] and len(turns) == 2
    assert turns[1].ids.tolist() == turns[0].ids.tolist()       # the first call was taken back
    assert g.tokens.tolist() == TOK("05>")["input_ids"] + ids("77") + [EOS]
    assert g.rewards.tolist() == [0.5] and g.loss_mask.sum() == 3


async def slow_turn_agent(row, base_url, api_key):
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20) as c:
        try:
            await c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        except openai.APIStatusError as exc:
            DISCONNECT["status"] = (exc.status_code, exc.body)
    return 1.0


def test_a_turn_past_the_call_timeout_ends_the_episode():
    DISCONNECT.clear()
    r = runner(slow_turn_agent, timeout_s=0.3)
    r.start(4, prompt_id=4, row=1, n=1, is_eval=False, temperature=1.0)
    (g,), turns, aborts = drive(r, lambda k, t: ids("1") + [EOS], answer=lambda k: False)
    r.close()
    assert DISCONNECT["status"][0] == 504 and DISCONNECT["status"][1]["code"] == "timeout"
    assert aborts == [turns[0].key]
    assert g.scalars[LIMITED] == 1 and g.rewards.tolist() == [0.0]


def sleepy_agent(row, base_url, api_key):
    time.sleep(3)
    return 1.0


def raising_agent(row, base_url, api_key):
    raise RuntimeError("the sandbox is down\nmore")


def silent_agent(row, base_url, api_key):
    return 1.0


def chatty_agent(row, base_url, api_key):
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20)
    msgs = [{"role": "user", "content": row["prompt"]}]
    for _ in range(5):
        r = client.chat.completions.create(model="policy", messages=msgs)
        msgs += [r.choices[0].message, {"role": "tool", "content": "=1>"}]
    return 1.0


@pytest.mark.parametrize("fn, kw, reason", [
    (sleepy_agent, {"agent_timeout_s": 0.5}, LIMITED),
    (chatty_agent, {"max_turns": 2}, LIMITED),
    (silent_agent, {}, REJECTED),
    (raising_agent, {"on_error": "zero"}, REWARD_ERRORS),
])
def test_agent_limits_and_faults_are_counted(fn, kw, reason):
    r = runner(fn, **kw)
    r.start(5, prompt_id=5, row=2, n=2, is_eval=False, temperature=1.0)
    (g,), _, _ = drive(r, lambda k, t: ids("1") + [EOS])
    r.close()
    assert g.scalars[reason] == 2 and g.rewards.tolist() == [0.0, 0.0]
    if fn is silent_agent:            # the row's prompt as context, nothing to train
        assert g.tokens[g.seq(0)].tolist() == ids("02>") and not g.loss_mask.any()


def test_an_agent_that_raises_fails_naming_it_and_the_row():
    r = runner(raising_agent)
    r.start(6, prompt_id=6, row=9, n=1, is_eval=False, temperature=1.0)
    with pytest.raises(BadEnvOutput) as info:
        drive(r, lambda k, t: ids("1") + [EOS], deadline_s=10)
    r.close()
    msg = str(info.value)
    assert "agent.py:run" in msg and "row 9" in msg and "run() raised RuntimeError: the sandbox is down" in msg
    assert "\n" not in msg


def test_close_stops_the_endpoint():
    r = runner(silent_agent)
    url = r.agent.endpoint.url
    r.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/e/x/v1/models", timeout=2)
    assert asyncio.iscoroutinefunction(tool_agent)


COMPLETIONS: dict = {}


def completions_agent(row, base_url, api_key):
    """/v1/completions: a text prompt, then the ids so far + more ids, then text that does not
    extend the trajectory (rejected)."""
    c = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20)
    r1 = c.completions.create(model="policy", prompt=row["prompt"], logprobs=0,
                              extra_body={"return_token_ids": True})
    ch = r1.choices[0].model_dump()
    more = ids("=9>")
    r2 = c.completions.create(model="policy", prompt=ch["prompt_token_ids"] + ch["token_ids"] + more,
                              extra_body={"return_token_ids": True})
    COMPLETIONS["calls"] = [ch, r2.choices[0].model_dump()]
    try:
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    except openai.BadRequestError as exc:
        COMPLETIONS["mixed"] = exc.body["code"]
    try:
        c.completions.create(model="policy", prompt="something else")
    except openai.BadRequestError as exc:
        COMPLETIONS["rewritten"] = exc.body["code"]
    return 1.0


def test_completions_extend_the_trajectory_by_text_or_ids():
    COMPLETIONS.clear()
    r = runner(completions_agent)
    r.start(8, prompt_id=8, row=6, n=1, is_eval=False, temperature=1.0)
    (g,), turns, _ = drive(r, lambda k, t: ids(f"{k}{k}") + [EOS])
    r.close()
    first, second = COMPLETIONS["calls"]
    assert first["prompt_token_ids"] == TOK("06>")["input_ids"] and first["text"] == "00"
    assert first["logprobs"]["token_logprobs"] == [-0.25] * 3 and first["finish_reason"] == "stop"
    assert second["prompt_token_ids"] == first["prompt_token_ids"] + first["token_ids"] + ids("=9>")
    assert [t.ids.tolist() for t in turns] == [first["prompt_token_ids"], second["prompt_token_ids"]]
    assert COMPLETIONS["mixed"] == "wrong_endpoint" and COMPLETIONS["rewritten"] == "rejected"
    assert g.scalars[REJECTED] == 1 and not g.loss_mask.any()        # a rewrite: not trained
    assert g.tokens.tolist() == second["prompt_token_ids"] + second["token_ids"]


RESPONSES: dict = {}


async def responses_tool_agent(row, base_url, api_key):
    """The Responses API (the openai-agents SDK's default): a function call in the output, sent
    back as input items with its output."""
    tools = [{"type": "function", "name": "lookup", "description": "the value of a key",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20) as c:
        items = [{"role": "user", "content": "what is 47?"}]
        r1 = await c.responses.create(model="policy", input=items, tools=tools, instructions="be brief",
                                      extra_body={"return_token_ids": True})
        call = r1.output[-1]
        items += [o.model_dump(exclude_none=True) for o in r1.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "47=42"})
        r2 = await c.responses.create(model="policy", input=items, tools=tools, instructions="be brief",
                                      extra_body={"return_token_ids": True})
        RESPONSES["calls"] = [r1.model_dump(), r2.model_dump()]
    return 1.0 if r2.output_text == "the answer is 42" else 0.0


def test_responses_function_calls_through_a_chat_template(hf_tokens):
    RESPONSES.clear()
    tok = hf_tokens.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    r = runner(responses_tool_agent, tokens=hf_tokens, max_new=200, budget=1000)
    r.start(2, prompt_id=2, row=0, n=1, is_eval=False, temperature=1.0)
    (g,), turns, _ = drive(r, lambda k, t: ids(CALL if k == 0 else "the answer is 42", tok) + [end])
    r.close()
    first, second = RESPONSES["calls"]
    assert [o["type"] for o in first["output"]] == ["function_call"] and first["status"] == "completed"
    fc = first["output"][0]
    assert fc["name"] == "lookup" and json.loads(fc["arguments"]) == {"key": "47"}
    assert second["output"][0]["content"][0]["text"] == "the answer is 42"
    assert second["usage"]["input_tokens"] == len(second["prompt_token_ids"])
    assert g.scalars[REJECTED] == 0 and g.scalars[TOOL_CALLS] == 1 and g.rewards.tolist() == [1.0]
    assert g.tokens.tolist() == second["prompt_token_ids"] + second["token_ids"]
    runs = np.flatnonzero(g.loss_mask)
    assert g.tokens[runs].tolist() == first["token_ids"] + second["token_ids"]
    text = tok.decode(second["prompt_token_ids"], skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nbe brief") and "47=42" in text


BRANCHING: dict = {}


async def branching_agent(row, base_url, api_key):
    """Fans out: two concurrent calls from the opening, each continued on its own branch, a
    sequential fork after a model turn, then forks until the episode's branches run out."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20) as c:
        calls = []

        async def call(m):
            r = await c.chat.completions.create(model="policy", messages=m, logprobs=True,
                                                extra_body={"return_token_ids": True})
            calls.append(r.model_dump())
            return r.choices[0].message
        msgs = [{"role": "user", "content": row["prompt"]}]
        a, b = await asyncio.gather(call(msgs), call(msgs))
        await asyncio.gather(call(msgs + [a, {"role": "tool", "content": "=1>"}]),
                             call(msgs + [b, {"role": "tool", "content": "=3>"}]))
        await call(msgs + [a, {"role": "tool", "content": "=2>"}])           # a fork after a's turn
        try:
            for _ in range(10):
                await call(msgs)
        except openai.BadRequestError as exc:
            BRANCHING["refused"] = exc.body["code"]
        BRANCHING["calls"] = calls
    return 0.5


def test_concurrent_and_forked_calls_are_branches_trained_each_as_a_sequence():
    from orchestrator.envs.base import BRANCHES, MAX_BRANCHES

    BRANCHING.clear()
    r = runner(branching_agent, max_turns=30, budget=400)
    r.start(9, prompt_id=9, row=4, n=1, is_eval=False, temperature=1.0)
    (g,), turns, _ = drive(r, lambda k, t: ids(str(k % 10)) + [EOS])
    r.close()
    calls = BRANCHING["calls"]
    assert BRANCHING["refused"] == "max_branches" and len(calls) == 5 + MAX_BRANCHES - 3
    assert g.n == MAX_BRANCHES and g.scalars[BRANCHES] == MAX_BRANCHES - 1 and g.scalars[REJECTED] == 0
    assert g.rewards.tolist() == [0.5] * g.n and g.prompt_lens.tolist() == [4] * g.n
    full = [c["prompt_token_ids"] + c["choices"][0]["token_ids"] for c in calls]
    seqs = [g.tokens[g.seq(i)].tolist() for i in range(g.n)]
    assert sorted(map(tuple, seqs)) == sorted({tuple(f) for f in full if not any(
        len(o) > len(f) and o[:len(f)] == f for o in full)})         # each branch's last call
    for i, seq in enumerate(seqs):      # token-exact per branch: its calls' sampled ids, their logprobs
        mine = [c for c, f in zip(calls, full) if seq[:len(f)] == f]
        want = np.zeros(len(seq), np.uint8)
        lps = np.zeros(len(seq), np.float32)
        for c in mine:
            p, t = len(c["prompt_token_ids"]), c["choices"][0]["token_ids"]
            want[p:p + len(t)] = 1
            lps[p:p + len(t)] = [x["logprob"] for x in c["choices"][0]["logprobs"]["content"]]
        assert g.loss_mask[g.seq(i)].tolist() == want.tolist()
        assert g.logprobs[g.seq(i)].tolist() == pytest.approx(lps.tolist())
    # the concurrent pair started from the same prompt; the fork after a's turn shares a's ids
    assert calls[0]["prompt_token_ids"] == calls[1]["prompt_token_ids"]
    assert len({tuple(t.ids.tolist()) for t in turns}) == len(turns) - (MAX_BRANCHES - 3) - 1


async def fan_out_one_gone_agent(row, base_url, api_key):
    """Two concurrent first calls; the first one's client gives up (its branch taken back)."""
    msgs = [{"role": "user", "content": row["prompt"]}]

    async def impatient():
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=0.5) as c:
            try:
                await c.chat.completions.create(model="policy", messages=msgs)
            except openai.APITimeoutError:
                DISCONNECT["timed_out"] = True

    async def patient():
        await asyncio.sleep(0.1)              # after the first is in flight: a fork
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20) as c:
            r = await c.chat.completions.create(model="policy", messages=msgs,
                                                extra_body={"return_token_ids": True})
        DISCONNECT["ok"] = r.model_dump()
    await asyncio.gather(impatient(), patient())
    return 0.5


def test_a_branch_whose_client_is_gone_is_taken_back_and_the_other_trained():
    from orchestrator.envs.base import BRANCHES

    DISCONNECT.clear()
    r = runner(fan_out_one_gone_agent)
    r.start(5, prompt_id=5, row=2, n=1, is_eval=False, temperature=1.0)
    (g,), turns, aborts = drive(r, lambda k, t: ids("66") + [EOS], answer=lambda k: k > 0)
    r.close()
    ok = DISCONNECT["ok"]
    assert DISCONNECT["timed_out"] and aborts == [turns[0].key] and len(turns) == 2
    assert g.n == 1 and g.scalars[BRANCHES] == 0 and g.scalars[REJECTED] == 0
    assert g.tokens.tolist() == ok["prompt_token_ids"] + ok["choices"][0]["token_ids"]
    assert g.loss_mask.sum() == 3 and g.rewards.tolist() == [0.5] and g.prompt_lens.tolist() == [4]
