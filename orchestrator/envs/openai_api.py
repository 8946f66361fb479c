"""The OpenAI wire format the agent endpoint speaks: typed requests, error bodies, response bodies.

Contract (no I/O here; `envs.endpoint` serves it, `envs.agent_session` fills it):
- `ApiError(status, message, type, code)`: an answer other than 200, sent as OpenAI's error body
  `{"error": {"message", "type", "param", "code"}}` (`body()`); `ended` marks one that ended the
  episode (limited or rejected).
- `chat_request(obj)` / `completion_request(obj)`: a parsed JSON body -> `ChatRequest` /
  `CompletionRequest` (pydantic), or ApiError 400 naming the field. What the runtime cannot honour
  is refused, never silently changed: `stream: true`, `n` > 1, stop strings (a turn ends on the
  model's stop tokens), `top_logprobs` > 0, `echo`. Sampling knobs (`temperature`, `top_p`,
  `seed`, ...) are accepted and ignored: the run samples with its own settings, so that the
  logprobs it trains on are the ones it sampled. Unknown keys are ignored, as OpenAI's SDKs send
  more than a server needs.
- `messages(raw)`: chat messages with string contents (text parts joined; other parts refused).
- `chat_body(...)`, `completion_body(...)`, `models_body(name)`: 200 bodies. Token ids come back
  where the request asks with `return_token_ids` (vLLM's extension: `prompt_token_ids` and each
  choice's `token_ids`).
"""
from __future__ import annotations

import time
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 code: Optional[str] = None, param: Optional[str] = None, ended: bool = False):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.ended = ended

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    stream: Optional[bool] = None
    n: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    return_token_ids: Optional[bool] = None

    def refuse_unsupported(self) -> None:
        if self.stream:
            raise ApiError(400, "stream: true is not supported by this endpoint", param="stream")
        if self.n not in (None, 1):
            raise ApiError(400, f"n={self.n}: one choice per call (each call is one turn of the "
                           f"episode)", param="n")
        if self.stop:
            raise ApiError(400, "stop strings are not supported: a turn ends on the model's stop "
                           "tokens, so that the trained ids are the sampled ids", param="stop")


class ChatRequest(_Request):
    messages: list[Any] = Field(min_length=1)
    tools: Optional[list[dict]] = None
    tool_choice: Optional[Union[str, dict]] = None
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0)

    @property
    def limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Request):
    prompt: Union[str, list[int], list[str]]
    logprobs: Optional[int] = Field(None, ge=0)
    echo: Optional[bool] = None

    @property
    def limit(self) -> Optional[int]:
        return self.max_tokens


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


def chat_body(req: ChatRequest, ident: str, model: str, content: Optional[str], calls: list[dict],
              finish: str, prompt_ids: list[int], ids: list[int], pieces: list[str],
              logprobs: list[float]) -> dict:
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    choice: dict = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
    if req.logprobs:
        choice["logprobs"] = {"content": [
            {"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
            for p, lp in zip(pieces, logprobs)]}
    body = {"id": ident, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": _usage(len(prompt_ids), len(ids))}
    if req.return_token_ids:
        choice["token_ids"] = list(ids)
        body["prompt_token_ids"] = list(prompt_ids)
    return body


def completion_body(req: CompletionRequest, ident: str, model: str, text: str, finish: str,
                    prompt_ids: list[int], ids: list[int], pieces: list[str],
                    logprobs: list[float]) -> dict:
    choice: dict = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    if req.logprobs is not None:
        offsets, at = [], 0
        for p in pieces:
            offsets.append(at)
            at += len(p)
        choice["logprobs"] = {"tokens": pieces, "token_logprobs": logprobs, "text_offset": offsets,
                              "top_logprobs": [{p: lp} for p, lp in zip(pieces, logprobs)]
                              if req.logprobs else None}
    if req.return_token_ids:
        choice["prompt_token_ids"] = list(prompt_ids)
        choice["token_ids"] = list(ids)
    return {"id": ident, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": _usage(len(prompt_ids), len(ids))}


def models_body(name: str) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "async-rl-orchestrator"}]}
