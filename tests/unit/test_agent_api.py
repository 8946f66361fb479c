"""The agent endpoint's wire format without a server: the hermes tool parser (calls, content before
them, an unclosed last call, malformed calls left as text) and request validation (what is refused
with which field named, what is accepted and ignored, message normalization)."""
import json

import pytest

from orchestrator.envs.openai_api import (ApiError, chat_body, chat_request, completion_request,
                                          messages)
from orchestrator.envs.tool_parser import parse_tool_calls


def ids(i):
    return f"call_{i}"


def test_hermes_parses_calls_and_the_content_before_them():
    text = ('Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "47"}}\n</tool_call>'
            '<tool_call>{"name": "add", "arguments": {"a": 1, "b": [2, "é"]}}</tool_call>')
    content, calls = parse_tool_calls("hermes", text, ids)
    assert content == "Let me look."
    assert [c["id"] for c in calls] == ["call_0", "call_1"]
    assert all(c["type"] == "function" for c in calls)
    assert [c["function"]["name"] for c in calls] == ["lookup", "add"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"key": "47"}, {"a": 1, "b": [2, "é"]}]


def test_hermes_cut_call_and_no_content():
    content, calls = parse_tool_calls("hermes", '<tool_call>{"name": "f", "arguments": {}}', ids)
    assert content is None and len(calls) == 1 and calls[0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("text", [
    "no call at all",
    "<tool_call>{not json}</tool_call>",
    '<tool_call>["name", "f"]</tool_call>',
    '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{oops</tool_call>',
])
def test_hermes_leaves_anything_malformed_as_text(text):
    assert parse_tool_calls("hermes", text, ids) == (text, [])


def _refused(fn, body, status, needle, param=None):
    with pytest.raises(ApiError) as info:
        fn(body)
    err = info.value
    assert err.status == status and needle in err.message, err.message
    body = err.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"
    if param is not None:
        assert body["param"] == param


MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, needle, param", [
    ([1, 2], "must be a JSON object", None),
    ({"messages": MSG}, "model: Field required", "model"),
    ({"model": "policy"}, "messages: Field required", "messages"),
    ({"model": "policy", "messages": []}, "messages", "messages"),
    ({"model": "policy", "messages": MSG, "stream": True}, "stream", "stream"),
    ({"model": "policy", "messages": MSG, "n": 2}, "n=2", "n"),
    ({"model": "policy", "messages": MSG, "stop": ["\n"]}, "stop strings", "stop"),
    ({"model": "policy", "messages": MSG, "top_logprobs": 5}, "top_logprobs", "top_logprobs"),
    ({"model": "policy", "messages": MSG, "max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"model": "policy", "messages": MSG, "max_tokens": "lots"}, "max_tokens", "max_tokens"),
])
def test_bad_chat_requests_are_400_naming_the_field(body, needle, param):
    _refused(chat_request, body, 400, needle, param)


def test_sampling_knobs_and_unknown_keys_are_accepted_and_ignored():
    req = chat_request({"model": "policy", "messages": MSG, "temperature": 0.1, "top_p": 0.5,
                        "seed": 3, "user": "me", "stop": None, "n": 1, "max_completion_tokens": 7,
                        "max_tokens": 9, "some_future_key": {"a": 1}})
    assert req.limit == 7 and req.logprobs is None


@pytest.mark.parametrize("body, needle", [
    ({"model": "policy", "prompt": ["a", "b"]}, "one prompt per call"),
    ({"model": "policy", "prompt": []}, "empty list"),
    ({"model": "policy", "prompt": "x", "echo": True}, "echo"),
    ({"model": "policy", "prompt": {"a": 1}}, "prompt"),
])
def test_bad_completion_requests(body, needle):
    _refused(completion_request, body, 400, needle)


def test_completion_prompt_forms():
    assert completion_request({"model": "m", "prompt": ["text"]}).prompt == "text"
    assert completion_request({"model": "m", "prompt": [1, 2, 3]}).prompt == [1, 2, 3]


def test_messages_normalized():
    out = messages([{"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}], "refusal": None},
                    {"role": "tool", "content": "=1>", "tool_call_id": "x"}])
    assert out == [{"role": "system", "content": "ab"},
                   {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]},
                   {"role": "tool", "content": "=1>", "tool_call_id": "x"}]
    for bad, needle in [([{"role": "wizard", "content": "x"}], "messages.0"),
                        ([{"content": "x"}], "messages.0"),
                        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "only text parts"),
                        ([{"role": "user", "content": 3}], "messages.0.content")]:
        with pytest.raises(ApiError, match=needle):
            messages(bad)


def test_chat_body_carries_ids_and_logprobs_only_when_asked():
    plain = chat_request({"model": "policy", "messages": MSG})
    body = chat_body(plain, "id", "policy", "hi", [], "stop", [1, 2], [5, 6], ["h", "i"], [-0.1, -0.2])
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert body["choices"][0]["logprobs"] is None and body["usage"]["total_tokens"] == 4
    asked = chat_request({"model": "policy", "messages": MSG, "logprobs": True, "return_token_ids": True})
    body = chat_body(asked, "id", "policy", None, [{"id": "c"}], "tool_calls", [1, 2], [5, 6],
                     ["h", "i"], [-0.1, -0.2])
    assert body["prompt_token_ids"] == [1, 2] and body["choices"][0]["token_ids"] == [5, 6]
    assert [t["logprob"] for t in body["choices"][0]["logprobs"]["content"]] == [-0.1, -0.2]
    assert body["choices"][0]["message"]["tool_calls"] == [{"id": "c"}]


def test_task_agent_config():
    from orchestrator.config import ConfigError, env_spec, load_config
    cfg = load_config(None, ["task.name=lookup", "task.agent=a.py:run", "task.reward=exact_match"])
    assert env_spec(cfg) == "a.py:run" and cfg.task.agent_timeout_s == 600
    cfg = load_config(None, ["task.name=dataset", "task.dataset=d.jsonl", "task.agent=m:run",
                             "eval.every_steps=0"])
    assert env_spec(cfg) == "m:run"
    with pytest.raises(ConfigError, match="task.agent and task.env are exclusive"):
        load_config(None, ["task.name=dataset", "task.dataset=d.jsonl", "task.agent=m:run",
                           "task.env=lookup", "eval.every_steps=0"])
    with pytest.raises(ConfigError, match="task.agent_timeout_s"):
        load_config(None, ["task.name=lookup", "task.agent=a.py:run", "task.agent_timeout_s=0"])
