"""One agent episode's side of the endpoint: every call appends to the episode's one trajectory.

Contract: `Session(key, runner, group, episode, parser)`; `await chat(req, task)` /
`await completion(req, task)` (from `envs.endpoint`) answer one call with a 200 body or raise
`ApiError`; `close()` (from `envs.agent`, when the agent's run is over) refuses later calls and
cancels the ones in flight. `ended` is None, "limited" or "rejected" once a call ended the episode.
Calls of one session run one at a time (a lock): each extends the trajectory the previous left.

A call, in order (anything refused before step 4 leaves the trajectory as it was):
1. The episode is live, still has turns (`task.max_turns`; the next call past it ends it: limited),
   and the call is the episode's kind (an episode is all chat calls or all completion calls).
2. Its prompt must extend the trajectory so far (the append-only rule of `envs.render`):
   - chat: the messages must start with the episode's conversation so far, each model turn as the
     assistant message this endpoint returned for it (its content and tool calls; or its raw text);
     the rest is rendered with the chat template (`TurnRenderer.opening` on the first call,
     `.reply` after: the template must reproduce the sampled text verbatim) and appended. The
     first call's messages are the opening (`task.system_prompt` goes first unless they have one).
   - completions: a prompt of token ids must start with the ids so far; a prompt string with
     their text (decoded with special tokens); the rest is tokenized and appended.
   A conversation that does not extend it (edited, dropped or reordered messages, a template that
   rewrites a turn) ends the episode: rejected, not trained (`envs.runner`), 400 `rejected`.
3. Budgets: a prompt that leaves no token of `task.max_episode_tokens` ends the episode (limited,
   400 `context_length_exceeded`); a `max_tokens` larger than the tokens left is refused (400
   `context_length_exceeded`, the episode goes on: the caller may ask for less); the turn gets
   min(max_tokens, rollout.max_new_tokens, tokens left).
4. One model turn through the runner (`EpisodeRunner.generate`: the worker's backend, the run's
   temperature, weights as loaded then), under `task.env_timeout_s`: past it the turn is aborted
   and the episode ends (limited, 504 `timeout`). The sampled ids are appended verbatim with their
   logprobs and versions. A client that disconnects meanwhile cancels the call: the turn is
   aborted in the backend and the call's prompt taken back off the trajectory.
5. The answer: the turn's text (stop token removed); with `tools` in a chat request, tool calls
   parsed by `envs.tool_parser` (`finish_reason: tool_calls`); `logprobs` and the token ids
   (`return_token_ids`) when asked.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Optional

from orchestrator.data.tokens import completion_text
from orchestrator.envs.openai_api import ApiError, chat_body, completion_body, messages
from orchestrator.envs.render import AppendError, TooLong
from orchestrator.envs.tool_parser import parse_tool_calls


class Session:
    def __init__(self, key: str, runner, group, episode, parser: str = "hermes",
                 model: str = "policy"):
        self.key, self.runner, self.g, self.ep, self.parser, self.model = (
            key, runner, group, episode, parser, model)
        self.lock = asyncio.Lock()
        self.kind: Optional[str] = None            # "chat" | "completions", set by the first call
        self.state = None                          # the renderer's state (chat)
        self.history: list[dict] = []              # the conversation as rendered (turns: raw text)
        self.returned: dict[int, dict] = {}        # history index -> the assistant message returned
        self.turn_ids: list[int] = []              # the last turn's sampled ids
        self.ended: Optional[str] = None
        self.closed = False
        self.tool_calls = 0
        self._calls: set = set()

    # ------------------------------------------------------------------ the agent's side
    def close(self) -> None:
        self.closed = True
        for t in list(self._calls):
            t.cancel()

    def _end(self, reason: str, status: int, message: str, code: str) -> ApiError:
        self.ended = reason
        return ApiError(status, f"{message}; the episode ended ({reason})", code=code, ended=True)

    def _check(self, kind: str) -> None:
        if self.closed:
            raise ApiError(404, "no live episode has this key (its run is over)", code="episode_not_found")
        if self.ended is not None:
            raise ApiError(400, f"the episode ended ({self.ended}): no more calls", code="episode_ended")
        if self.kind not in (None, kind):
            raise ApiError(400, f"this episode's calls are {self.kind} calls: one episode is one "
                           f"trajectory of one kind", code="wrong_endpoint")
        lim = self.runner.limits
        if self.ep.turns >= lim.max_turns:
            raise self._end("limited", 400, f"task.max_turns={lim.max_turns} model turns were taken",
                            "max_turns")

    # ------------------------------------------------------------------ chat
    async def chat(self, req, task: Optional[asyncio.Task] = None) -> dict:
        async with self.lock:
            self._check("chat")
            r = self.runner.renderer
            msgs = messages(req.messages)
            if req.tools and not r.chat:
                raise ApiError(400, "tools need a chat template, and the model's tokenizer has none",
                               param="tools")
            left = self.runner.limits.max_episode_tokens - len(self.ep.ids)
            try:
                if self.kind is None:
                    new, state = await self.runner.rendered(r.opening, msgs, req.tools, left)
                else:
                    k = len(self.history)
                    self._extends(msgs, k)
                    state = dataclasses.replace(self.state, tools=req.tools)
                    new = await self.runner.rendered(r.reply, state, self.history, self.turn_ids,
                                                     msgs[k:], left)
            except TooLong:
                raise self._end("limited", 400, "the messages do not fit in the tokens the episode "
                                "has left", "context_length_exceeded") from None
            except AppendError as exc:
                if self.kind is None:
                    raise ApiError(400, f"the messages cannot be rendered ({exc})", param="messages") from None
                raise self._end("rejected", 400, f"the chat template does not extend the episode's "
                                f"trajectory ({exc})", "rejected") from None
            except TypeError as exc:
                raise ApiError(400, f"the messages cannot be rendered ({exc})", param="messages") from None
            prompt, ids, lps, vers = await self._turn(new, req.limit, "chat", task,
                                                      (state, msgs if self.kind is None else
                                                       [*self.history, *msgs[len(self.history):]]))
            text, pieces = await self.runner.rendered(self._decode, ids)
            content, calls = text, []
            if req.tools and req.tool_choice != "none":
                n = self.ep.turns
                content, calls = parse_tool_calls(self.parser, text,
                                                  lambda i: f"call_{self.key[:8]}_{n}_{i}")
            self.history.append({"role": "assistant", "content": text})
            self.returned[len(self.history) - 1] = {"content": content, "tool_calls": calls}
            self.tool_calls += len(calls)
            stopped = bool(ids) and ids[-1] in self.runner.tokens.stop_ids
            finish = "tool_calls" if calls else ("stop" if stopped else "length")
            return chat_body(req, f"chatcmpl-{self.key[:8]}-{self.ep.turns}", self.model, content,
                             calls, finish, prompt, ids, pieces, lps)

    def _extends(self, msgs: list[dict], k: int) -> None:
        """The call's messages start with the conversation so far, or the episode is rejected."""
        if len(msgs) < k:
            raise self._end("rejected", 400, f"the messages hold {len(msgs)} of the episode's {k} "
                            f"messages so far: a conversation is only ever extended", "rejected")
        for i in range(k):
            got, want = msgs[i], self.history[i]
            same = (_same_turn(got, want["content"], self.returned[i]) if i in self.returned
                    else _plain(got) == _plain(want))
            if not same:
                raise self._end("rejected", 400, f"message {i} ({got.get('role')}) differs from the "
                                f"episode's conversation: a conversation is only ever extended",
                                "rejected")

    # ------------------------------------------------------------------ completions
    async def completion(self, req, task: Optional[asyncio.Task] = None) -> dict:
        async with self.lock:
            self._check("completions")
            new = await self._completion_prompt(req.prompt)
            prompt, ids, lps, vers = await self._turn(new, req.limit, "completions", task, None)
            text, pieces = await self.runner.rendered(self._decode, ids)
            stopped = bool(ids) and ids[-1] in self.runner.tokens.stop_ids
            return completion_body(req, f"cmpl-{self.key[:8]}-{self.ep.turns}", self.model, text,
                                   "stop" if stopped else "length", prompt, ids, pieces, lps)

    async def _completion_prompt(self, prompt) -> list[int]:
        so_far, tok = self.ep.ids, self.runner.renderer.tok
        if isinstance(prompt, list):
            vocab = len(tok)
            if any(not 0 <= t < vocab for t in prompt):
                raise ApiError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
            if prompt[:len(so_far)] != so_far:
                raise self._end("rejected", 400, "the prompt's ids do not start with the episode's "
                                "ids so far", "rejected")
            return list(prompt[len(so_far):])
        left = self.runner.limits.max_episode_tokens - len(so_far)
        if len(prompt) > (left + len(so_far) + 1) * self.runner.renderer.max_token_chars:
            raise self._end("limited", 400, "the prompt does not fit in the tokens the episode has "
                            "left", "context_length_exceeded")
        return await self.runner.rendered(self._prompt_ids, prompt, so_far)

    def _prompt_ids(self, prompt: str, so_far: list[int]) -> list[int]:
        """(render thread) The ids a prompt string appends to `so_far`, or the episode is rejected."""
        tok = self.runner.renderer.tok
        if not so_far:
            return [int(t) for t in tok(prompt)["input_ids"]]
        text = tok.decode(so_far, skip_special_tokens=False)
        if not prompt.startswith(text):
            raise self._end("rejected", 400, "the prompt does not start with the episode's text so "
                            "far", "rejected")
        rest = prompt[len(text):]
        ids = [int(t) for t in tok(rest, add_special_tokens=False)["input_ids"]]
        if tok.decode(ids, skip_special_tokens=False) != rest:
            raise self._end("rejected", 400, f"the prompt's new text {rest[:40]!r} does not survive "
                            f"tokenization", "rejected")
        return ids

    # ------------------------------------------------------------------ one turn
    async def _turn(self, new: list[int], limit: Optional[int], kind: str,
                    task: Optional[asyncio.Task], chat: Optional[tuple]) -> tuple:
        """Append `new` (context), sample one turn, append it: (prompt ids, ids, logprobs, versions)."""
        ep, lim = self.ep, self.runner.limits
        left = lim.max_episode_tokens - len(ep.ids) - len(new)
        if left <= 0:
            raise self._end("limited", 400, f"the prompt leaves none of the episode's "
                            f"task.max_episode_tokens={lim.max_episode_tokens}", "context_length_exceeded")
        if limit is not None and limit > left:
            raise ApiError(400, f"max_tokens={limit} is more than the {left} tokens the episode has "
                           f"left (task.max_episode_tokens={lim.max_episode_tokens})",
                           code="context_length_exceeded", param="max_tokens")
        undo = (len(ep.ids), ep.prompt_len, self.kind, self.state, self.history)
        first = self.kind is None
        ep.ids += new
        ep.mask += [0] * len(new)
        ep.logprobs += [0.0] * len(new)
        ep.versions += [-1] * len(new)
        if first:
            ep.prompt_len = len(new)
        self.kind = kind
        if chat is not None:
            self.state, self.history = chat[0], list(chat[1])
        prompt = list(ep.ids)
        if task is not None:
            self._calls.add(task)
        try:
            ids, lps, vers = await asyncio.wait_for(
                self.runner.generate(self.g, ep, min(limit or lim.max_new_tokens, lim.max_new_tokens, left)),
                lim.timeout_s)
        except BaseException as exc:     # disconnected, timed out, closed: the call is taken back
            n = undo[0]
            del ep.ids[n:], ep.mask[n:], ep.logprobs[n:], ep.versions[n:]
            ep.prompt_len, self.kind, self.state, self.history = undo[1:]
            if isinstance(exc, asyncio.TimeoutError):
                raise self._end("limited", 504, f"the turn took longer than task.env_timeout_s="
                                f"{lim.timeout_s:g}", "timeout") from None
            raise
        finally:
            self._calls.discard(task)
        ep.turns += 1
        ep.ids += ids
        ep.mask += [1] * len(ids)
        ep.logprobs += lps
        ep.versions += vers
        self.turn_ids = ids
        return prompt, ids, lps, vers

    def _decode(self, ids: list[int]) -> tuple[str, list[str]]:
        """(render thread) The turn's text (stop token removed) and each token's text."""
        tok = self.runner.renderer.tok
        return (completion_text(self.runner.tokens, ids),
                [tok.decode([t], skip_special_tokens=False) for t in ids])


def _plain(m: dict) -> dict:
    return {k: v for k, v in m.items() if v not in (None, "", [])}


def _args(arguments) -> object:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments


def _calls(calls) -> list:
    out = []
    for c in calls or []:
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict):
            return [object()]          # matches nothing
        out.append((f.get("name"), _args(f.get("arguments"))))
    return out


def _same_turn(got: dict, raw: str, returned: dict) -> bool:
    """The agent's copy of a model turn is the message returned for it (content and tool calls),
    or the turn's raw text with no tool calls."""
    if got.get("role") != "assistant":
        return False
    content = got.get("content") or ""
    if content == raw and not got.get("tool_calls"):
        return True
    return content == (returned["content"] or "") and _calls(got.get("tool_calls")) == _calls(returned["tool_calls"])
