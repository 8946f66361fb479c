"""`stream: true` answers of the agent endpoint: a Turn as OpenAI's server-sent-event chunks.

Contract (no I/O here; `envs.endpoint` writes the events): `chat_chunks(req, turn)` /
`completion_chunks(req, turn)` -> the `chat.completion.chunk` / `text_completion` objects of one
streamed answer, `event(obj)` one `data: {json}\n\n` event and `DONE` the closing `data: [DONE]`.
A turn is sampled whole by the backend (the decode loop hands a turn back when it ends), so the
chunks are sent once it is sampled: streaming changes how the answer is framed, never which ids
are sampled or trained (the session appends the sampled ids as for a plain answer). The chunks
carry the same tokens as the plain answer:
- chat: a first chunk with `role: assistant`; then one chunk per sampled id, its `content` delta
  the id's share of the text (`Turn.deltas`: the deltas join to the plain answer's content), with
  its logprob (`logprobs: true`) and `token_ids: [id]` (`return_token_ids`, vLLM's form; the
  first chunk carries `prompt_token_ids`). A turn parsed into tool calls is one chunk with the
  content before the calls (when any) and every id, then one chunk with all `tool_calls` (each
  with its `index`). The last chunk has the `finish_reason`. With
  `stream_options.include_usage`, every chunk has `usage: null` and one more chunk with no
  choices carries the usage, as OpenAI sends it.
- completions: one chunk per sampled id (`text` delta, `logprobs` as a plain answer's, per id;
  `token_ids`), the last with the `finish_reason`; usage as for chat.
"""
from __future__ import annotations

import json

from orchestrator.envs.openai_api import ChatRequest, CompletionRequest, Turn, chat_logprobs, \
    completion_logprobs

DONE = b"data: [DONE]\n\n"


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _frame(req, turn: Turn, obj: str, choices: list[dict]) -> dict:
    out = {"id": turn.ident, "object": obj, "created": turn.created, "model": turn.model,
           "choices": choices}
    if req.include_usage:
        out["usage"] = None
    return out


def _tail(req, turn: Turn, obj: str, chunks: list[dict]) -> list[dict]:
    chunks[-1]["choices"][0]["finish_reason"] = turn.finish
    if req.include_usage:
        chunks.append({**_frame(req, turn, obj, []), "usage": turn.usage})
    return chunks


def chat_chunks(req: ChatRequest, turn: Turn) -> list[dict]:
    obj = "chat.completion.chunk"

    def choice(delta: dict, ids: list[int], lo: int = 0, hi: int = 0) -> dict:
        c: dict = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}
        if req.logprobs and hi > lo:
            c["logprobs"] = chat_logprobs(turn.pieces[lo:hi], turn.logprobs[lo:hi])
        if req.return_token_ids:
            c["token_ids"] = ids
        return c

    first = _frame(req, turn, obj, [choice({"role": "assistant", "content": ""}, [])])
    if req.return_token_ids:
        first["prompt_token_ids"] = list(turn.prompt_ids)
    chunks = [first]
    n = len(turn.ids)
    if turn.calls:
        chunks.append(_frame(req, turn, obj, [choice({"content": turn.content or ""},
                                                     list(turn.ids), 0, n)]))
        calls = [{"index": i, **c} for i, c in enumerate(turn.calls)]
        chunks.append(_frame(req, turn, obj, [choice({"tool_calls": calls}, [])]))
    else:
        for i in range(n):
            chunks.append(_frame(req, turn, obj, [choice({"content": turn.deltas[i]},
                                                         [turn.ids[i]], i, i + 1)]))
    return _tail(req, turn, obj, chunks)


def completion_chunks(req: CompletionRequest, turn: Turn) -> list[dict]:
    obj, chunks, at = "text_completion", [], 0
    for i in range(max(1, len(turn.ids))):
        piece = turn.deltas[i] if turn.ids else ""
        c: dict = {"index": 0, "text": piece, "finish_reason": None, "logprobs": None}
        if req.logprobs is not None and turn.ids:
            c["logprobs"] = completion_logprobs(turn.pieces[i:i + 1], turn.logprobs[i:i + 1],
                                                bool(req.logprobs), at)
            at += len(turn.pieces[i])
        if req.return_token_ids:
            c["token_ids"] = turn.ids[i:i + 1]
            if i == 0:
                c["prompt_token_ids"] = list(turn.prompt_ids)
        chunks.append(_frame(req, turn, obj, [c]))
    return _tail(req, turn, obj, chunks)
