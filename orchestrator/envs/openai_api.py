"""The OpenAI wire format the agent endpoint speaks: typed requests, error bodies, response bodies.

Contract (no I/O here; `envs.endpoint` serves it, `envs.agent_session` fills it):
- `ApiError(status, message, type, code)`: an answer other than 200, sent as OpenAI's error body
  `{"error": {"message", "type", "param", "code"}}` (`body()`); `ended` marks one that ended the
  episode (limited or rejected).
- `chat_request(obj)` / `completion_request(obj)`: a parsed JSON body -> `ChatRequest` /
  `CompletionRequest` (pydantic), or ApiError 400 naming the field. What the runtime cannot honour
  is refused by name, never silently changed: `n` > 1, stop strings (a turn ends on the model's
  stop tokens), `top_logprobs` > 0, `echo`, `suffix`, `best_of` > 1; `tool_choice: "required"` or
  a named function and `response_format` other than `text` (both need constrained decoding, which
  the endpoint does not do: use `auto` and check the answer); `parallel_tool_calls: false`; the
  legacy `functions` / `function_call`; `modalities` other than text, `audio`,
  `reasoning_effort`, `verbosity`, `web_search_options`. Honoured: `tool_choice: "auto"` (tool
  calls parsed) and `"none"` (the turn's text is content, never parsed into calls), `stream` (with
  `stream_options.include_usage`: `envs.sse`).
- Sampling knobs (`SAMPLING`: temperature, top_p, seed, penalties, logit_bias, top_k, min_p,
  repetition_penalty) are overridden: the run samples with its own settings (temperature
  `rollout.temperature`, top_p 1, no per-call seed) so that the logprobs it trains on are the ones
  it sampled. `overridden(temperature)` names each one a request set to another value
  (`name=requested->used; ...`, the endpoint's `x-arl-overridden` header); `ignored()` names the
  unknown keys (`x-arl-ignored`), except `HARMLESS` ones that change no token (user, metadata, ...).
- `messages(raw)`: chat messages with string contents (text parts joined; other parts refused).
- `Turn`: one answered call (the session's result); `chat_body(req, turn)`,
  `completion_body(req, turn)`, `models_body(name)`: 200 bodies. Token ids come back where the
  request asks with `return_token_ids` (vLLM's extension: `prompt_token_ids` and each choice's
  `token_ids`).
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ROLES = ("system", "developer", "user", "assistant", "tool")
# knob -> the value the run uses instead ("T": the run's temperature)
SAMPLING = {"temperature": "T", "top_p": 1, "seed": "run", "frequency_penalty": 0,
            "presence_penalty": 0, "logit_bias": {}, "top_k": -1, "min_p": 0,
            "repetition_penalty": 1}
HARMLESS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key",
                      "prompt_cache_retention", "safety_identifier", "prediction"})
CONSTRAINED = "needs constrained decoding, which this endpoint does not do"


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 code: Optional[str] = None, param: Optional[str] = None, ended: bool = False):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.ended = ended

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def refuse(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def _short(v) -> str:
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    text = "".join(c if " " <= c < "\x7f" and c != ";" else "?" for c in text)
    return text if len(text) <= 40 else text[:37] + "..."


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    stream: Optional[bool] = None
    stream_options: Optional[dict] = None
    n: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    return_token_ids: Optional[bool] = None

    def refuse_unsupported(self) -> None:
        if self.n not in (None, 1):
            raise ApiError(400, f"n={self.n}: one choice per call (each call is one turn of the "
                           f"episode)", param="n")
        if self.stop:
            raise ApiError(400, "stop strings are not supported: a turn ends on the model's stop "
                           "tokens, so that the trained ids are the sampled ids", param="stop")

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def overridden(self, temperature: float) -> str:
        """The sampling knobs this request set that the run overrides: `name=asked->used; ...`."""
        extra, out = self.model_extra or {}, []
        for name, used in SAMPLING.items():
            asked = extra.get(name)
            used = temperature if used == "T" else used
            if asked is None or asked == used:
                continue
            out.append(f"{name}={_short(asked)}->{_short(used)}")
        return "; ".join(out)

    def ignored(self) -> str:
        """Keys this endpoint does not know (their values ignored), comma-separated."""
        return ",".join(sorted(_short(k) for k, v in (self.model_extra or {}).items()
                               if k not in SAMPLING and k not in HARMLESS and v is not None))


class ChatRequest(_Request):
    messages: list[Any] = Field(min_length=1)
    tools: Optional[list[dict]] = None
    tool_choice: Optional[Union[str, dict]] = None
    response_format: Optional[dict] = None
    parallel_tool_calls: Optional[bool] = None
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0)

    @property
    def limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens

    @property
    def parse_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tool_choice not in (None, "none", "auto"):
            what = (f"{self.tool_choice!r}" if isinstance(self.tool_choice, str)
                    else "a named function")
            raise refuse("tool_choice", f"{what} {CONSTRAINED}; use 'auto' (calls are parsed out "
                         f"of the turn) or 'none', and check the answer's tool_calls")
        fmt = (self.response_format or {}).get("type", "text")
        if fmt != "text":
            raise refuse("response_format", f"{_short(fmt)} {CONSTRAINED}; ask for the format in "
                         f"the messages and parse (and retry) on your side")
        if self.parallel_tool_calls is False:
            raise refuse("parallel_tool_calls", "false is not enforced: a turn may hold several "
                         "calls, all of them returned")
        extra = self.model_extra or {}
        for name, why in [("functions", "the legacy functions API: use tools"),
                          ("function_call", "the legacy functions API: use tool_choice"),
                          ("audio", "text only"), ("reasoning_effort", "the chat template decides"),
                          ("verbosity", "not supported"), ("web_search_options", "no web search")]:
            if extra.get(name) is not None:
                raise refuse(name, why)
        if extra.get("modalities") not in (None, ["text"]):
            raise refuse("modalities", "text only")


class CompletionRequest(_Request):
    prompt: Union[str, list[int], list[str]]
    logprobs: Optional[int] = Field(None, ge=0)
    echo: Optional[bool] = None

    @property
    def limit(self) -> Optional[int]:
        return self.max_tokens

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        extra = self.model_extra or {}
        if extra.get("suffix"):
            raise refuse("suffix", "not supported (a completion only appends)")
        if extra.get("best_of") not in (None, 1):
            raise refuse("best_of", "one sample per call (each call is one turn of the episode)")


def _parse(cls, obj):
    if not isinstance(obj, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(obj).__name__}")
    try:
        req = cls.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise ApiError(400, f"{where}: {err['msg']}", param=where) from None
    req.refuse_unsupported()
    return req


def chat_request(obj) -> ChatRequest:
    req = _parse(ChatRequest, obj)
    if req.top_logprobs:
        raise ApiError(400, "top_logprobs > 0 is not supported (each token's own logprob is: "
                       "logprobs: true)", param="top_logprobs")
    return req


def completion_request(obj) -> CompletionRequest:
    req = _parse(CompletionRequest, obj)
    if req.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], str):
        if len(req.prompt) != 1:
            raise ApiError(400, "one prompt per call (each call is one turn of the episode)",
                           param="prompt")
        req.prompt = req.prompt[0]
    if isinstance(req.prompt, list) and not req.prompt:
        raise ApiError(400, "prompt: an empty list of token ids", param="prompt")
    return req


def _text(content, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ApiError(400, f"messages.{i}.content: only text parts are supported",
                               param=f"messages.{i}.content")
            parts.append(p["text"])
        return "".join(parts)
    raise ApiError(400, f"messages.{i}.content: a string or a list of text parts",
                   param=f"messages.{i}.content")


def messages(raw: list) -> list[dict]:
    """The request's messages with string contents; other keys (tool_calls, tool_call_id, name)
    kept for the chat template."""
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"messages.{i}: a message needs a role among {', '.join(ROLES)}",
                           param=f"messages.{i}")
        msg = {k: v for k, v in m.items() if v is not None}
        msg["content"] = _text(m.get("content"), i)
        out.append(msg)
    return out


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


@dataclass
class Turn:
    """One answered call: what the session sampled and what the agent is shown of it.
    `text`: the turn's text (stop token removed); `content` / `calls`: it parsed (chat with tools:
    the text before the first call, and the calls; else `content == text`, no calls); `pieces`:
    each sampled id's text (special tokens kept; only when logprobs are asked); `deltas`: each
    sampled id's share of `text` (their concatenation is `text`, a stop token's is ""; only when
    streamed)."""
    ident: str
    model: str
    text: str
    content: Optional[str]
    calls: list[dict]
    finish: str
    prompt_ids: list[int]
    ids: list[int]
    pieces: list[str]
    deltas: list[str]
    logprobs: list[float]
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def usage(self) -> dict:
        return _usage(len(self.prompt_ids), len(self.ids))


def chat_logprobs(pieces: list[str], logprobs: list[float]) -> dict:
    return {"content": [{"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                        for p, lp in zip(pieces, logprobs)]}


def chat_body(req: ChatRequest, turn: Turn) -> dict:
    message: dict = {"role": "assistant", "content": turn.content}
    if turn.calls:
        message["tool_calls"] = turn.calls
    choice: dict = {"index": 0, "message": message, "finish_reason": turn.finish, "logprobs": None}
    if req.logprobs:
        choice["logprobs"] = chat_logprobs(turn.pieces, turn.logprobs)
    body = {"id": turn.ident, "object": "chat.completion", "created": turn.created,
            "model": turn.model, "choices": [choice], "usage": turn.usage}
    if req.return_token_ids:
        choice["token_ids"] = list(turn.ids)
        body["prompt_token_ids"] = list(turn.prompt_ids)
    return body


def completion_logprobs(pieces: list[str], logprobs: list[float], top: bool, at: int = 0) -> dict:
    offsets = []
    for p in pieces:
        offsets.append(at)
        at += len(p)
    return {"tokens": list(pieces), "token_logprobs": list(logprobs), "text_offset": offsets,
            "top_logprobs": [{p: lp} for p, lp in zip(pieces, logprobs)] if top else None}


def completion_body(req: CompletionRequest, turn: Turn) -> dict:
    choice: dict = {"index": 0, "text": turn.text, "finish_reason": turn.finish, "logprobs": None}
    if req.logprobs is not None:
        choice["logprobs"] = completion_logprobs(turn.pieces, turn.logprobs, bool(req.logprobs))
    if req.return_token_ids:
        choice["prompt_token_ids"] = list(turn.prompt_ids)
        choice["token_ids"] = list(turn.ids)
    return {"id": turn.ident, "object": "text_completion", "created": turn.created,
            "model": turn.model, "choices": [choice], "usage": turn.usage}


def models_body(name: str) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "async-rl-orchestrator"}]}
