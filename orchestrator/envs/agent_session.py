"""One agent episode's side of the endpoint: every call appends to one branch of the episode.

Contract: `Session(key, runner, group, episode, parser)`; `await chat(req, task)` /
`await completion(req, task)` (from `envs.endpoint`) answer one call with a `Turn`
(`envs.openai_api`) or raise `ApiError`; `await aclose()` (from `envs.agent`, when the agent's run
is over) refuses later calls and cancels the ones in flight, waiting (bounded) until they have
taken their turns back (`close()`: the same without the wait). `ended` is None, "limited" or "rejected"
once a call ended the episode. `extra()`: the branches beyond the first, each a trajectory
(`Branch`: ids, mask, logprobs, versions, prompt_len) trained as its own sequence with the
episode's reward (`envs.runner`); the first branch is the episode's own trajectory (`ep`).

Branches. An episode's calls form a tree: every call continues one branch, and branches run
concurrently (agents that fan out: parallel tool calls, sub-agents). A branch is one trajectory
built only by appending (the append-only rule of `envs.render`); its fork points are where it stood
before each of its model turns (its ids ending with the generation prompt) and after each. A call
(routing and rendering are one at a time, a lock; the model turn is not):
1. The episode is live, still has turns (`task.max_turns` counts the model turns of every branch,
   in flight included; the next call past it ends it: limited), and the call is the episode's kind
   (an episode is all chat calls or all completion calls).
2. Routing: the call continues the branch whose whole trajectory it extends, when that branch has
   no call in flight (the deepest, when several); else it forks a new branch (a copy of the ids up
   to the deepest fork point it extends, on any branch) - a second call sent while the first is in
   flight forks where the first stood before its turn; an agent that retries or fans out from an
   earlier message forks there. At most `MAX_BRANCHES` (`envs.base`) branches: a call past it is
   400 `max_branches` (the episode goes on). A call that extends no fork point at all (its opening
   differs, a model turn sent back other than as returned) ends the episode: rejected, not trained
   (`envs.runner`), 400 `rejected`.
   - chat: "extends" means the messages start with the branch's conversation up to that point, each
     model turn as the assistant message this endpoint returned for it (its content and tool calls;
     or its raw text); the rest is rendered with the chat template (`TurnRenderer.opening` on the
     first call, `.reply` after a model turn: the template must reproduce the sampled text verbatim,
     or the episode is rejected) and appended. A fork before a turn takes exactly that point's
     messages. The first call's messages are the opening (`task.system_prompt` goes first unless
     they have one).
   - completions: a prompt of token ids must start with the branch's ids up to the point; a prompt
     string with their text (decoded with special tokens); the rest is tokenized and appended.
3. Budgets: `task.max_episode_tokens` bounds the tokens of all the episode's branches together
   (each branch counted whole, as it is trained): a prompt that leaves none ends the episode
   (limited, 400 `context_length_exceeded`); a `max_tokens` larger than the tokens left is refused
   (400 `context_length_exceeded`, the episode goes on: the caller may ask for less); the turn gets
   min(max_tokens, rollout.max_new_tokens, tokens left).
4. One model turn through the runner (`EpisodeRunner.generate`: the worker's backend, the run's
   temperature, weights as loaded then), under `task.env_timeout_s`: past it the turn is aborted
   and the episode ends (limited, 504 `timeout`). The sampled ids are appended verbatim to the
   branch with their logprobs and versions. A client that disconnects meanwhile cancels the call:
   the turn is aborted in the backend and the call's prompt taken back off its branch (a branch the
   call forked is dropped).
5. The answer (`Turn`): the turn's text (stop token removed); with `tools` in a chat request and
   `tool_choice` other than "none", tool calls parsed by `envs.tool_parser` (`finish_reason:
   tool_calls`); each id's text (only with logprobs asked) and its share of the text (only when
   streamed: `envs.sse`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Optional

from orchestrator.data.tokens import completion_text
from orchestrator.envs.base import MAX_BRANCHES
from orchestrator.envs.branches import Branch, Point, _Prompt
from orchestrator.envs.openai_api import ApiError, Turn, messages
from orchestrator.envs.render import AppendError, TooLong
from orchestrator.envs.tool_parser import parse_tool_calls

CLOSE_S = 2.0           # aclose(): calls in flight get this long to take their turns back


class Session:
    def __init__(self, key: str, runner, group, episode, parser: str = "hermes",
                 model: str = "policy"):
        self.key, self.runner, self.g, self.ep, self.parser, self.model = (
            key, runner, group, episode, parser, model)
        self.lock = asyncio.Lock()
        self.kind: Optional[str] = None            # "chat" | "completions", set by the first call
        self.branches: list[Branch] = []           # [0]: the episode's own trajectory (ep's lists)
        self.ended: Optional[str] = None
        self.closed = False
        self.tool_calls = 0
        self.inflight = 0
        self._calls: set = set()

    def extra(self) -> list[Branch]:
        """(once no call is in flight) The branches beyond the first that hold a model turn, each
        trained as a sequence. A first branch whose calls were all taken back (its client gone) is
        replaced by the next one, so that the episode's own trajectory is one that was sampled."""
        live = [b for b in self.branches[1:] if any(b.mask)]
        ep = self.ep
        if live and not any(ep.mask):
            b = live.pop(0)
            ep.ids[:], ep.mask[:], ep.logprobs[:], ep.versions[:] = b.ids, b.mask, b.logprobs, b.versions
            ep.prompt_len = b.prompt_len
        return live

    # ------------------------------------------------------------------ the agent's side
    def close(self) -> None:
        self.closed = True
        for t in list(self._calls):
            t.cancel()

    async def aclose(self) -> None:
        """`close()`, then wait (at most CLOSE_S) for the calls in flight to take their turns back,
        so that nothing changes the episode's trajectories after it."""
        tasks = [t for t in self._calls if t is not asyncio.current_task()]
        self.close()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_S)

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
        if self.ep.turns + self.inflight >= lim.max_turns:
            raise self._end("limited", 400, f"task.max_turns={lim.max_turns} model turns were taken",
                            "max_turns")

    def _left(self) -> int:
        """The episode's tokens left: every branch whole, and the turns in flight at their most."""
        return (self.runner.limits.max_episode_tokens - sum(len(b.ids) for b in self.branches)
                - sum(b.reserve for b in self.branches if b.busy))

    def _main(self) -> Branch:
        ep = self.ep
        return Branch(ep.ids, ep.mask, ep.logprobs, ep.versions)

    def _forked(self, base: Branch, p: Optional[Point]) -> Branch:
        if p is None:
            return base
        if len(self.branches) >= MAX_BRANCHES:
            raise ApiError(400, f"the call would start a branch beyond the episode's {MAX_BRANCHES} "
                           f"(a call forks when it does not extend a branch that is free)",
                           code="max_branches")
        return base.fork(p)

    # ------------------------------------------------------------------ chat
    async def chat(self, req, task: Optional[asyncio.Task] = None) -> Turn:
        r = self.runner.renderer
        async with self.lock:
            self._check("chat")
            msgs = messages(req.messages)
            if req.tools and not r.chat:
                raise ApiError(400, "tools need a chat template, and the model's tokenizer has none",
                               param="tools")
            left = self._left()
            first, forked = not self.branches, False
            try:
                if first:
                    b = self._main()
                    new, state = await self.runner.rendered(r.opening, msgs, req.tools, left)
                    history = list(msgs)
                else:
                    base, p = self._route_chat(msgs)
                    b, forked = self._forked(base, p), p is not None
                    at = p or b.points[-1]          # a fork point, or the branch's last turn
                    state = dataclasses.replace(at.state, tools=req.tools)
                    new = [] if at.turn_ids is None else await self.runner.rendered(
                        r.reply, state, b.history[:at.k], at.turn_ids, msgs[at.k:], left)
                    history = [*b.history[:at.k], *msgs[at.k:]]
            except TooLong:
                raise self._end("limited", 400, "the messages do not fit in the tokens the episode "
                                "has left", "context_length_exceeded") from None
            except AppendError as exc:
                if first:
                    raise ApiError(400, f"the messages cannot be rendered ({exc})",
                                   param="messages") from None
                raise self._end("rejected", 400, f"the chat template does not extend the episode's "
                                f"trajectory ({exc})", "rejected") from None
            except TypeError as exc:
                raise ApiError(400, f"the messages cannot be rendered ({exc})", param="messages") from None
            prompt = self._prepare(b, new, req.limit, state, history, forked)
        ids, lps = await self._turn(b, prompt, new, req.limit, task, forked)
        try:
            text, pieces, deltas = await self.runner.rendered(self._decode, ids, bool(req.logprobs),
                                                              bool(req.stream))
            content, calls = text, []
            if req.tools and req.tool_choice != "none":
                n = self.ep.turns
                content, calls = parse_tool_calls(self.parser, text,
                                                  lambda i: f"call_{self.key[:8]}_{n}_{i}")
            b.history.append({"role": "assistant", "content": text})
            b.returned[len(b.history) - 1] = {"content": content, "tool_calls": calls}
            b.points.append(Point(len(b.ids), len(b.history), b.state, ids))
        finally:
            b.busy = False
        self.tool_calls += len(calls)
        return Turn(f"chatcmpl-{self.key[:8]}-{self.ep.turns}", self.model, text, content, calls,
                    self._finish(ids, calls), prompt, ids, pieces, deltas, lps)

    def _route_chat(self, msgs: list[dict]) -> tuple[Branch, Optional[Point]]:
        """(the branch to continue, None) or (the branch to fork, the point), else rejected."""
        tips = [b for b in self.branches if not b.busy and b.points and b.points[-1].turn_ids is not None
                and len(msgs) > len(b.history) and _match(msgs, b, len(b.history))[0]]
        if tips:
            return max(tips, key=lambda b: len(b.ids)), None
        best, why = None, (0, None)
        for b in self.branches:
            for p in reversed(b.points):
                if best is not None and p.n <= best[1].n:
                    break
                if (len(msgs) > p.k) if p.turn_ids is not None else (len(msgs) == p.k):
                    ok, at = _match(msgs, b, p.k)
                    if ok:
                        best = (b, p)
                        break
                    why = max(why, (at, msgs[at].get("role") if at < len(msgs) else None))
        if best is None:
            raise self._end("rejected", 400, f"message {why[0]} ({why[1]}) differs from every branch "
                            f"of the episode's conversation: a conversation is only ever extended "
                            f"(or forked after a model turn)", "rejected")
        return best

    # ------------------------------------------------------------------ completions
    async def completion(self, req, task: Optional[asyncio.Task] = None) -> Turn:
        async with self.lock:
            self._check("completions")
            if not self.branches:
                b, p, new = self._main(), None, await self._prompt(req.prompt, [])
            else:
                b, p, new = await self._route_completion(req.prompt)
            forked = p is not None
            b = self._forked(b, p)
            prompt = self._prepare(b, new, req.limit, None, None, forked)
        ids, lps = await self._turn(b, prompt, new, req.limit, task, forked)
        try:
            text, pieces, deltas = await self.runner.rendered(
                self._decode, ids, req.logprobs is not None, bool(req.stream))
            b.points.append(Point(len(b.ids), 0, None, ids))
        finally:
            b.busy = False
        return Turn(f"cmpl-{self.key[:8]}-{self.ep.turns}", self.model, text, text, [],
                    self._finish(ids, []), prompt, ids, pieces, deltas, lps)

    async def _route_completion(self, prompt) -> tuple[Branch, Optional[Point], list[int]]:
        for b in sorted((b for b in self.branches if not b.busy), key=lambda b: -len(b.ids)):
            new = await self._prompt(prompt, b.ids)
            if new is not None:
                return b, None, new
        cands = sorted(((p, b) for b in self.branches for p in b.points), key=lambda x: -x[0].n)
        for p, b in cands:
            new = await self._prompt(prompt, b.ids[:p.n])
            if new is not None:
                return b, p, new
        raise self._end("rejected", 400, "the prompt does not start with the ids (or text) of any "
                        "branch of the episode so far", "rejected")

    async def _prompt(self, prompt, so_far: list[int]) -> Optional[list[int]]:
        """The ids `prompt` appends to `so_far`; None when it does not extend them."""
        tok = self.runner.renderer.tok
        if isinstance(prompt, list):
            vocab = len(tok)
            if any(not 0 <= t < vocab for t in prompt):
                raise ApiError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
            return list(prompt[len(so_far):]) if prompt[:len(so_far)] == so_far else None
        left = self._left()
        if len(prompt) > (left + len(so_far) + 1) * self.runner.renderer.max_token_chars:
            raise self._end("limited", 400, "the prompt does not fit in the tokens the episode has "
                            "left", "context_length_exceeded")
        return await self.runner.rendered(self._prompt_ids, prompt, so_far)

    def _prompt_ids(self, prompt: str, so_far: list[int]) -> Optional[list[int]]:
        """(render thread) The ids a prompt string appends to `so_far` (None: it does not)."""
        tok = self.runner.renderer.tok
        if not so_far:
            return [int(t) for t in tok(prompt)["input_ids"]]
        text = tok.decode(so_far, skip_special_tokens=False)
        if not prompt.startswith(text):
            return None
        rest = prompt[len(text):]
        ids = [int(t) for t in tok(rest, add_special_tokens=False)["input_ids"]]
        if tok.decode(ids, skip_special_tokens=False) != rest:
            raise self._end("rejected", 400, f"the prompt's new text {rest[:40]!r} does not survive "
                            f"tokenization", "rejected")
        return ids

    # ------------------------------------------------------------------ one turn
    def _prepare(self, b: Branch, new: list[int], limit: Optional[int], state, history,
                 forked: bool) -> list[int]:
        """Check the budget, append `new` (context) to branch `b`, mark it busy: the turn's prompt.
        Synchronous: nothing else runs on the loop meanwhile."""
        lim = self.runner.limits
        if self.closed:                 # closed while the call was routed: nothing is appended
            raise ApiError(404, "no live episode has this key (its run is over)", code="episode_not_found")
        left = self._left() - len(new) - (len(b.ids) if forked else 0)
        if left <= 0:
            raise self._end("limited", 400, f"the prompt leaves none of the episode's "
                            f"task.max_episode_tokens={lim.max_episode_tokens}", "context_length_exceeded")
        if limit is not None and limit > left:
            raise ApiError(400, f"max_tokens={limit} is more than the {left} tokens the episode has "
                           f"left (task.max_episode_tokens={lim.max_episode_tokens})",
                           code="context_length_exceeded", param="max_tokens")
        first = not self.branches
        if first or forked:
            self.branches.append(b)
        b.undo = (len(b.ids), b.state, b.history, len(b.points))
        b.append(new, 0)
        if first:
            b.prompt_len = self.ep.prompt_len = len(new)
        self.kind = self.kind or ("chat" if history is not None else "completions")
        if history is not None:
            b.state, b.history = state, history
        b.points.append(Point(len(b.ids), len(b.history), b.state))
        b.reserve = min(limit or lim.max_new_tokens, lim.max_new_tokens, left)
        b.busy = True
        self.inflight += 1
        return list(b.ids)

    async def _turn(self, b: Branch, prompt: list[int], new: list[int], limit: Optional[int],
                    task: Optional[asyncio.Task], forked: bool) -> tuple[list[int], list[float]]:
        """Sample one turn for branch `b` (prepared: its ids are the prompt) and append it."""
        lim = self.runner.limits
        if task is not None:
            self._calls.add(task)
        view = _Prompt(prompt, index=self.ep.index)    # what the backend samples after
        try:
            ids, lps, vers = await asyncio.wait_for(
                self.runner.generate(self.g, view, b.reserve),
                lim.timeout_s)
        except BaseException as exc:     # disconnected, timed out, closed: the call is taken back
            b.busy = False
            n, b.state, b.history, npoints = b.undo
            b.cut(n)
            del b.points[npoints:]
            if forked or len(self.branches) == 1 and n == 0:
                self.branches.remove(b)
            if not self.branches:
                self.kind, self.ep.prompt_len = None, 0
            if isinstance(exc, asyncio.TimeoutError):
                raise self._end("limited", 504, f"the turn took longer than task.env_timeout_s="
                                f"{lim.timeout_s:g}", "timeout") from None
            raise
        finally:
            self.ep.gen_s += view.gen_s
            self.inflight -= 1
            self._calls.discard(task)
        self.ep.turns += 1
        b.append(ids, 1, lps, vers)
        b.turn_ids = ids
        return ids, lps

    def _finish(self, ids: list[int], calls: list) -> str:
        stopped = bool(ids) and ids[-1] in self.runner.tokens.stop_ids
        return "tool_calls" if calls else ("stop" if stopped else "length")

    def _decode(self, ids: list[int], pieces: bool, deltas: bool) -> tuple[str, list[str], list[str]]:
        """(render thread) The turn's text (stop token removed); when asked, each id's text
        (logprobs) and each id's share of the turn's text (streaming: joined, the text)."""
        tok = self.runner.renderer.tok
        text = completion_text(self.runner.tokens, ids)
        each = [tok.decode([t], skip_special_tokens=False) for t in ids] if pieces else []
        return text, each, (_deltas(tok, self.runner.tokens.stop_ids, ids, text) if deltas else [])


def _deltas(tok, stop_ids, ids: list[int], text: str) -> list[str]:
    """Each id's share of `text` (the ids' text, a final stop token removed): their concatenation is
    `text`; an id that ends inside a character gets "" and the next one the character."""
    body = ids[:-1] if ids and ids[-1] in stop_ids else ids
    out = [tok.decode([t], skip_special_tokens=True) for t in body]
    if "".join(out) != text:            # pieces that split a character: by prefixes
        out, prev = [], ""
        for i in range(len(body)):
            cur = tok.decode(body[:i + 1], skip_special_tokens=True)
            ok = cur.startswith(prev) and "\ufffd" not in cur[len(prev):]
            out.append(cur[len(prev):] if ok else "")
            prev = cur if ok else prev
        if out:
            out[-1] += text[len(prev):] if text.startswith(prev) else ""
        if "".join(out) != text:
            out = [text] + [""] * (len(body) - 1) if body else []
    return out + [""] * (len(ids) - len(body))


def _match(msgs: list[dict], b: Branch, k: int) -> tuple[bool, int]:
    """Whether the messages start with branch `b`'s first `k` messages (each model turn as
    returned); else (False, the first message that differs)."""
    if len(msgs) < k:
        return False, len(msgs)
    for i in range(k):
        got, want = msgs[i], b.history[i]
        same = (_same_turn(got, want["content"], b.returned[i]) if i in b.returned
                else _plain(got) == _plain(want))
        if not same:
            return False, i
    return True, k


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
