"""The Responses API subset the agent endpoint serves (`POST /v1/responses`, the openai-agents SDK's
default): text and function calls, as chat completions underneath.

Contract (no I/O here; `envs.endpoint` serves it): `responses_request(obj) -> ResponsesRequest`
(pydantic) or ApiError 400 naming the field; `req.chat()` -> the `ChatRequest` the session answers
(so a response is token-exact exactly as a chat completion is: the same trajectory rules,
`envs.agent_session`); `response_body(req, turn)` the 200 body.
- Input: `input` a string (one user message) or a list of items: messages (`type: message` or no
  type; role user / system / developer / assistant; content a string or `input_text` /
  `output_text` parts), `function_call` items (`call_id`, `name`, `arguments`: the assistant turn's
  tool calls; consecutive ones, and an assistant message before them, are one turn) and
  `function_call_output` items (`call_id`, `output`: a tool message). `instructions` is the system
  message first. `tools` of `type: function` (`name`, `description`, `parameters`).
  A model turn is sent back as it was returned: the response's output items, in order.
- Output: a `message` item (`output_text`, with its `logprobs` when `include` asks for
  `message.output_text.logprobs`) when the turn has text, then one `function_call` item per parsed
  call (`call_id` as a chat completion's tool call id); `status` `completed`, or `incomplete`
  (`incomplete_details.reason: max_output_tokens`) when the turn was cut; `usage` (input, output,
  total tokens). `return_token_ids: true` (the vLLM-style extension) adds `prompt_token_ids` and
  `token_ids` to the body.
- Refused by name (400), never ignored: `stream: true` (not served on this route: use chat
  completions to stream), `previous_response_id` and `conversation` (nothing is stored: send the
  conversation in `input`), `background`, `prompt` (templates), `reasoning`, `include` other than
  the logprobs, `tools` other than functions, `tool_choice` other than auto / none, `text.format`
  other than text (constrained decoding), `parallel_tool_calls: false`, `truncation: auto`,
  `max_tool_calls`, `top_logprobs` > 0, items of other types, non-text content parts. Sampling
  knobs are overridden as for chat (`x-arl-overridden`), unknown keys reported (`x-arl-ignored`).
"""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field

from orchestrator.envs.openai_api import CONSTRAINED, ApiError, ChatRequest, Turn, _parse, \
    _Request, chat_logprobs, refuse

LOGPROBS = "message.output_text.logprobs"
_ROLES = ("user", "system", "developer", "assistant")


class ResponsesRequest(_Request):
    input: Union[str, list[Any]]
    instructions: Optional[str] = None
    tools: Optional[list[dict]] = None
    tool_choice: Optional[Union[str, dict]] = None
    parallel_tool_calls: Optional[bool] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    include: Optional[list[str]] = None
    text: Optional[dict] = None
    truncation: Optional[str] = None
    top_logprobs: Optional[int] = Field(None, ge=0)

    @property
    def limit(self) -> Optional[int]:
        return self.max_output_tokens or self.max_tokens

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.stream:
            raise refuse("stream", "true is not served on /v1/responses (use stream=false, or "
                         "/v1/chat/completions, which streams)")
        extra = self.model_extra or {}
        for name, why in [("previous_response_id", "nothing is stored: send the whole conversation "
                           "in input"), ("conversation", "nothing is stored: send the whole "
                           "conversation in input"), ("prompt", "prompt templates are not served"),
                          ("reasoning", "the chat template decides"),
                          ("max_tool_calls", "not enforced"), ("background", "not served")]:
            if extra.get(name) not in (None, False):
                raise refuse(name, why)
        if any(i != LOGPROBS for i in self.include or ()):
            raise refuse("include", f"only {LOGPROBS!r} is served")
        if self.tool_choice not in (None, "none", "auto"):
            what = "a named tool" if isinstance(self.tool_choice, dict) else repr(self.tool_choice)
            raise refuse("tool_choice", f"{what} {CONSTRAINED}; use 'auto' and check the output's "
                         f"function calls")
        fmt = ((self.text or {}).get("format") or {}).get("type", "text")
        if fmt != "text" or (self.text or {}).get("verbosity") is not None:
            raise refuse("text", f"text.format {fmt!r} {CONSTRAINED}" if fmt != "text"
                         else "text.verbosity is not supported")
        if self.parallel_tool_calls is False:
            raise refuse("parallel_tool_calls", "false is not enforced: a turn may hold several "
                         "calls, all of them returned")
        if self.truncation not in (None, "disabled"):
            raise refuse("truncation", "only 'disabled': an episode is never truncated")
        if self.top_logprobs:
            raise refuse("top_logprobs", "> 0 is not supported (each token's own logprob is: "
                         f"include {LOGPROBS!r})")
        for i, t in enumerate(self.tools or ()):
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
                raise refuse(f"tools.{i}", "only tools of type function (with a name) are served")

    def chat(self) -> ChatRequest:
        """The chat completion this response is."""
        msgs = [{"role": "system", "content": self.instructions}] if self.instructions else []
        msgs += _messages(self.input)
        tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                   if k in t}} for t in self.tools or ()]
        return ChatRequest(model=self.model, messages=msgs, tools=tools or None,
                           tool_choice=self.tool_choice, max_completion_tokens=self.limit,
                           logprobs=LOGPROBS in (self.include or ()))


def responses_request(obj) -> ResponsesRequest:
    req = _parse(ResponsesRequest, obj)
    if isinstance(req.input, list) and not req.input:
        raise ApiError(400, "input: an empty list of items", param="input")
    return req


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text") \
                    or not isinstance(p.get("text"), str):
                raise ApiError(400, f"{where}: only text parts are supported", param=where)
            out.append(p["text"])
        return "".join(out)
    raise ApiError(400, f"{where}: a string or a list of text parts", param=where)


def _messages(items) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, it in enumerate(items):
        where = f"input.{i}"
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if kind == "message" and it.get("role") in _ROLES:
            out.append({"role": it["role"], "content": _text(it.get("content"), where + ".content")})
        elif kind == "function_call":
            if not isinstance(it.get("name"), str) or not isinstance(it.get("call_id"), str):
                raise ApiError(400, f"{where}: a function_call needs call_id and name", param=where)
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant":          # the same turn's text or calls
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = it.get("output")
            out.append({"role": "tool", "tool_call_id": it.get("call_id"),
                        "content": output if isinstance(output, str) else _text(output, where + ".output")})
        else:
            raise ApiError(400, f"{where}: items of type {kind!r} are not served (message, "
                           f"function_call, function_call_output)", param=where)
    return out


def response_body(req: ResponsesRequest, turn: Turn) -> dict:
    output: list[dict] = []
    if turn.content or not turn.calls:
        part = {"type": "output_text", "text": turn.content or "", "annotations": []}
        if LOGPROBS in (req.include or ()):
            part["logprobs"] = chat_logprobs(turn.pieces, turn.logprobs)["content"]
        output.append({"type": "message", "id": f"msg_{turn.ident}", "status": "completed",
                       "role": "assistant", "content": [part]})
    for c in turn.calls:
        f = c["function"]
        output.append({"type": "function_call", "id": f"fc_{c['id']}", "call_id": c["id"],
                       "name": f["name"], "arguments": f["arguments"], "status": "completed"})
    cut = turn.finish == "length"
    u = turn.usage
    body = {"id": f"resp_{turn.ident}", "object": "response", "created_at": turn.created,
            "status": "incomplete" if cut else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": turn.model, "output": output, "parallel_tool_calls": True,
            "previous_response_id": None, "reasoning": None, "store": False,
            "temperature": None, "top_p": None, "text": {"format": {"type": "text"}},
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "truncation": "disabled", "metadata": {},
            "usage": {"input_tokens": u["prompt_tokens"],
                      "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": u["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": u["total_tokens"]}}
    if req.return_token_ids:
        body["prompt_token_ids"], body["token_ids"] = list(turn.prompt_ids), list(turn.ids)
    return body

