"""The agent endpoint's wire format without a server: the hermes tool parser (calls, content before
them, an unclosed last call, malformed calls left as text) and request validation (what is refused
with which field named, what is accepted and ignored, message normalization)."""
import json

import pytest

from orchestrator.envs.openai_api import (ApiError, Turn, chat_body, chat_request,
                                          completion_request, messages)
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
    ({"model": "policy", "messages": MSG, "tool_choice": "required"}, "constrained decoding", "tool_choice"),
    ({"model": "policy", "messages": MSG, "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "a named function", "tool_choice"),
    ({"model": "policy", "messages": MSG, "response_format": {"type": "json_object"}}, "json_object", "response_format"),
    ({"model": "policy", "messages": MSG, "response_format": {"type": "json_schema", "json_schema": {}}},
     "json_schema", "response_format"),
    ({"model": "policy", "messages": MSG, "parallel_tool_calls": False}, "not enforced", "parallel_tool_calls"),
    ({"model": "policy", "messages": MSG, "functions": [{"name": "f"}]}, "legacy", "functions"),
    ({"model": "policy", "messages": MSG, "modalities": ["text", "audio"]}, "text only", "modalities"),
    ({"model": "policy", "messages": MSG, "reasoning_effort": "high"}, "chat template", "reasoning_effort"),
    ({"model": "policy", "messages": MSG, "n": 2}, "n=2", "n"),
    ({"model": "policy", "messages": MSG, "stop": ["\n"]}, "stop strings", "stop"),
    ({"model": "policy", "messages": MSG, "top_logprobs": 5}, "top_logprobs", "top_logprobs"),
    ({"model": "policy", "messages": MSG, "max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"model": "policy", "messages": MSG, "max_tokens": "lots"}, "max_tokens", "max_tokens"),
])
def test_bad_chat_requests_are_400_naming_the_field(body, needle, param):
    _refused(chat_request, body, 400, needle, param)


def test_sampling_knobs_are_overridden_and_unknown_keys_reported_by_name():
    req = chat_request({"model": "policy", "messages": MSG, "temperature": 0.1, "top_p": 0.5,
                        "seed": 3, "user": "me", "stop": None, "n": 1, "max_completion_tokens": 7,
                        "max_tokens": 9, "some_future_key": {"a": 1}, "tool_choice": "auto",
                        "response_format": {"type": "text"}, "stream": True,
                        "stream_options": {"include_usage": True}})
    assert req.limit == 7 and req.logprobs is None and req.stream and req.include_usage
    assert req.overridden(1.0) == "temperature=0.1->1.0; top_p=0.5->1; seed=3->run"
    assert req.ignored() == "some_future_key"          # user: harmless, not reported
    same = chat_request({"model": "policy", "messages": MSG, "temperature": 1.0, "top_p": 1})
    assert same.overridden(1.0) == "" and same.ignored() == ""


@pytest.mark.parametrize("body, needle", [
    ({"model": "policy", "prompt": ["a", "b"]}, "one prompt per call"),
    ({"model": "policy", "prompt": []}, "empty list"),
    ({"model": "policy", "prompt": "x", "echo": True}, "echo"),
    ({"model": "policy", "prompt": "x", "suffix": "y"}, "suffix"),
    ({"model": "policy", "prompt": "x", "best_of": 3}, "one sample per call"),
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


def _turn(content="hi", calls=(), finish="stop"):
    return Turn("id", "policy", "hi", content, list(calls), finish, [1, 2], [5, 6], ["h", "i"],
                ["h", "i"], [-0.1, -0.2])


def test_chat_body_carries_ids_and_logprobs_only_when_asked():
    plain = chat_request({"model": "policy", "messages": MSG})
    body = chat_body(plain, _turn())
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert body["choices"][0]["logprobs"] is None and body["usage"]["total_tokens"] == 4
    asked = chat_request({"model": "policy", "messages": MSG, "logprobs": True, "return_token_ids": True})
    body = chat_body(asked, _turn(None, [{"id": "c"}], "tool_calls"))
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


def test_responses_input_items_become_the_chat_turns_they_are():
    from orchestrator.envs.responses_api import responses_request

    req = responses_request({
        "model": "policy", "instructions": "be brief", "max_output_tokens": 5, "store": False,
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}, "strict": True}],
        "input": [{"role": "user", "content": "47>"},
                  {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                   "content": [{"type": "output_text", "text": "let me see", "annotations": []}]},
                  {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"k": 47}'},
                  {"type": "function_call", "call_id": "c2", "name": "lookup", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "=83>"},
                  {"role": "user", "content": [{"type": "input_text", "text": "and?"}]}]})
    chat = req.chat()
    assert chat.limit == 5 and chat.tools == [{"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object"}}}]
    assert chat.messages == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "47>"},
        {"role": "assistant", "content": "let me see", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"k": 47}'}},
            {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "=83>"}, {"role": "user", "content": "and?"}]
    assert responses_request({"model": "p", "input": "hi"}).chat().messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("extra, param", [
    ({"stream": True}, "stream"), ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tool_choice": "required"}, "tool_choice"), ({"text": {"format": {"type": "json_schema"}}}, "text"),
    ({"include": ["reasoning.encrypted_content"]}, "include"), ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"tools": [{"type": "web_search"}]}, "tools.0"), ({"truncation": "auto"}, "truncation"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input.0"), ({"input": []}, "input"),
])
def test_responses_refuse_what_they_do_not_serve_by_name(extra, param):
    from orchestrator.envs.responses_api import responses_request

    with pytest.raises(ApiError) as info:
        responses_request({"model": "policy", "input": "hi", **extra}).chat()
    assert info.value.status == 400 and info.value.param == param, info.value.message


def test_response_body_items_and_the_openai_client_reads_them():
    from openai.types.responses import Response

    from orchestrator.envs.responses_api import response_body, responses_request

    req = responses_request({"model": "policy", "input": "hi", "include": ["message.output_text.logprobs"],
                             "return_token_ids": True})
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = response_body(req, _turn("hi", [call], "tool_calls"))
    r = Response.model_validate(body)
    assert r.output_text == "hi" and r.status == "completed" and r.usage.total_tokens == 4
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert r.output[1].call_id == "call_1" and r.output[1].name == "f"
    assert [t.logprob for t in r.output[0].content[0].logprobs] == [-0.1, -0.2]
    assert body["token_ids"] == [5, 6] and body["prompt_token_ids"] == [1, 2]
    cut = Response.model_validate(response_body(req, _turn(finish="length")))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_streamed_chunks_carry_the_plain_answers_tokens():
    from orchestrator.envs.sse import DONE, chat_chunks, completion_chunks, event

    req = chat_request({"model": "policy", "messages": MSG, "stream": True, "logprobs": True,
                        "return_token_ids": True, "stream_options": {"include_usage": True}})
    chunks = chat_chunks(req, _turn())
    body = [c for c in chunks if c["choices"]]
    assert body[0]["choices"][0]["delta"]["role"] == "assistant" and body[0]["prompt_token_ids"] == [1, 2]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in body) == "hi"
    assert [t for c in body for t in c["choices"][0]["token_ids"]] == [5, 6]
    assert [t["logprob"] for c in body if c["choices"][0]["logprobs"]
            for t in c["choices"][0]["logprobs"]["content"]] == [-0.1, -0.2]
    assert body[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1] == {**chunks[-1], "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2,
                                                                  "total_tokens": 4}}
    assert all(c["usage"] is None for c in chunks[:-1])
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    calls = chat_chunks(req, _turn(None, [call], "tool_calls"))
    assert calls[-2]["choices"][0]["delta"]["tool_calls"] == [{"index": 0, **call}]
    assert event({"a": 1}) == b'data: {"a":1}\n\n' and DONE == b"data: [DONE]\n\n"
    creq = completion_request({"model": "policy", "prompt": "x", "stream": True, "logprobs": 0})
    texts = completion_chunks(creq, _turn())
    assert [c["choices"][0]["text"] for c in texts] == ["h", "i"] and "usage" not in texts[-1]
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in texts] == [[0], [1]]
