"""`task.env: verifiers`: run an environment written for the `verifiers` library unchanged.

Supported: verifiers >=0.1.8,<0.1.11 (the `verifiers` extra; tested: 0.1.8.post2, 0.1.9.post3,
0.1.10): the releases whose classic in-process API takes an OpenAI-style async client,
`Environment.rollout(input, client, model, sampling_args) -> State`, the model reached only through
`await client.chat.completions.create(model=, messages=, tools=, ...)`, `vf.ToolEnv(tools=[python
functions], dataset=, rubric=)`, `vf.Rubric` scoring the finished `State`. Not supported: 0.1.7 and
older (another rollout signature), 0.1.11-0.3.x (the client became verifiers' own `vf.Client`
wrapper; the stack lives on as `verifiers.legacy`), and the 0.4 line, which drops the in-process
stack for a runtime that talks to an HTTP inference server (it runs as `task.agent` through
`envs.verifiers_agent`). The installed version is checked when `task.env=verifiers` is resolved
(preflight): a DataError naming the supported range otherwise, and for 0.4 and later the
`task.agent` lines that run it.

Configuration (`task.env_args`, scalars only):
- `env`: what builds the verifiers environment: `file.py:load_environment` / `module:fn` (a function
  returning a `vf.Environment`, or the environment object itself) or the id of an installed
  verifiers environment package (`vf.load_environment(id, ...)`).
- `tool_parser`: how a model turn's text becomes OpenAI tool calls (an inference server's job, done
  here): `hermes` (default: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, the
  format of Qwen-style chat templates; a block that is not such JSON stays text), `none`, or
  `file.py:fn` / `module:fn` with `fn(text) -> (content, [{"name", "arguments"}, ...])`.
- every other key is a keyword argument of the environment's loader.
The environment is built once per inference worker (off the event loop) and shared by its episodes.
Rows come from `task.dataset` in verifiers' columns: `prompt` (chat messages, or a string) or
`question`, `answer`, `task`, `info`, `example_id`; a string becomes the environment's system prompt
and few-shot turns plus one user turn, as verifiers formats its own datasets. Sampling is ours
(rollout.*): sampling arguments the environment passes are ignored.

Contract (inversion of control): `reset(row)` starts verifiers' own rollout coroutine as a task on
the runner's event loop with a client of ours, and returns the messages of its first `create()`
call (the call's `tools` become `self.tools`, given to the chat template). Each `create()` hands the
conversation to our side and waits; `step(turn)` answers it with a `ChatCompletion` built from the
turn (`content` and `tool_calls` per `tool_parser`; finish_reason `tool_calls`, `stop` when the turn
ended on a stop token, else `length`), then waits for the next `create()` -> `StepResult(the
messages appended since, not counting the assistant message it produced; tool_calls: the tool
replies among them)`, or for the rollout's end -> `StepResult(done=True)`. `score()` runs the
environment's rubric on the finished `State` (`state["reward"]`); `close()` cancels a rollout still
running (an episode ended by one of our limits). A conversation that is not the previous one plus
our reply (an environment that rewrites or truncates history) raises a clear error: trajectories
here are append-only token sequences. A verifiers error the rollout records itself (0.1.10: an
empty model turn, a tool error it was told to stop on) ends the episode as verifiers would, and it
is scored; an exception out of the rollout (0.1.8, 0.1.9 raise those) is the environment's error.
Blocking work: verifiers calls a plain-function tool inline on the event loop; the adapter wraps
each plain tool of a ToolEnv-style environment (`tool_map`) to run on the runner's thread pool
(the loop's default pool with `task.env_processes`); a tool still running when its episode ends
(a timeout) finishes in its thread. Reward functions run as verifiers calls them
(keep them fast or async). Building a verifiers Environment installs SIGINT/SIGTERM handlers;
inside our workers signals belong to the worker, so the adapter leaves them out.
Not supported: completion-style (`message_type="completion"`) environments, group-level reward
functions (episodes are scored one by one), verifiers' own env servers.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import contextvars
import functools
import inspect
import itertools
import json
import re
import signal
import sys
import threading
import time
import uuid
from importlib.metadata import version as _dist_version
from typing import Any, Callable, Optional

from orchestrator.data.tokens import DataError
from orchestrator.envs.base import Environment, ModelTurn, StepResult

SUPPORTED = ((0, 1, 8), (0, 1, 11))          # [low, high) of the verifiers releases this adapter drives
SUPPORTED_TEXT = ">=0.1.8,<0.1.11"
MODEL = "policy"                              # the model name verifiers sees
HINT = "pip install -e '.[verifiers]'"


def _version_tuple(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


try:
    import verifiers as vf
except ImportError as exc:
    if isinstance(exc, ModuleNotFoundError) and exc.name == "verifiers":
        raise DataError(f"task.env='verifiers' needs the verifiers package ({HINT}; supported: "
                        f"verifiers{SUPPORTED_TEXT})") from None
    raise DataError(f"task.env='verifiers': importing verifiers failed ({type(exc).__name__}: "
                    f"{exc})".splitlines()[0]) from None
_VERSION = _dist_version("verifiers")
if _version_tuple(_VERSION) >= (0, 4):
    raise DataError(f"task.env='verifiers': verifiers {_VERSION} is installed, whose environments run "
                    f"through an agent endpoint: set task.agent=agent.py:run (not task.env), agent.py "
                    f"holding 'from orchestrator.envs.verifiers_agent import verifiers_agent' and "
                    f"'run = verifiers_agent(load_environment())'; task.env='verifiers' drives "
                    f"verifiers{SUPPORTED_TEXT}")
if not SUPPORTED[0] <= _version_tuple(_VERSION) < SUPPORTED[1]:
    raise DataError(f"task.env='verifiers': verifiers {_VERSION} is installed; this adapter drives the "
                    f"classic in-process API of verifiers{SUPPORTED_TEXT} ({HINT})")

from openai.types.chat import ChatCompletion        # noqa: E402 - a dependency of verifiers


class _NoHandlers:
    """`signal` as verifiers' environment module sees it: installing a handler is a no-op."""

    def __getattr__(self, name: str):
        return getattr(signal, name)

    @staticmethod
    def signal(signum, handler):
        return None


_env_module = sys.modules.get(vf.Environment.__module__)
if _env_module is not None and getattr(_env_module, "signal", None) is signal:
    _env_module.signal = _NoHandlers()

_TOOL_POOL: contextvars.ContextVar = contextvars.ContextVar("verifiers_tool_pool", default=None)
_BUILT: dict[tuple, Any] = {}
_BUILD_LOCK = threading.Lock()
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


class ConversationRewritten(RuntimeError):
    """The environment sent a conversation that does not extend the previous one."""


# ---------------------------------------------------------------------------- loading
def _off_loop(fn: Callable) -> Callable:
    @functools.wraps(fn)
    async def call(*args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(
            _TOOL_POOL.get(), functools.partial(fn, *args, **kwargs))
    return call


def _build(spec: str, kwargs: dict):
    from orchestrator.data.rewards import load_user_object
    if ":" in spec:
        obj = load_user_object(spec, "task.env_args.env", "function")
        if isinstance(obj, vf.Environment):
            if kwargs:
                raise DataError(f"task.env_args.env={spec!r} is an environment object: it takes no "
                                f"arguments (got {', '.join(sorted(kwargs))})")
            env = obj
        else:
            env = obj(**kwargs)
    else:
        env = vf.load_environment(spec, **kwargs)
    if not isinstance(env, vf.Environment):
        raise DataError(f"task.env_args.env={spec!r} returned {type(env).__name__}, not a "
                        f"verifiers Environment")
    if getattr(env, "message_type", "chat") != "chat":
        raise DataError(f"task.env_args.env={spec!r}: a completion-style verifiers environment "
                        f"(message_type={env.message_type!r}); only chat environments are supported")
    tools = getattr(env, "tool_map", None)
    if isinstance(tools, dict):            # ToolEnv & co. call plain tools inline: move them off the loop
        for name, fn in list(tools.items()):
            if not (inspect.iscoroutinefunction(fn)
                    or inspect.iscoroutinefunction(getattr(fn, "__call__", None))):
                tools[name] = _off_loop(fn)
    return env


def load(spec: str, kwargs: dict):
    """The verifiers environment `spec` builds with `kwargs`, built once per process."""
    key = (spec, tuple(sorted(kwargs.items())))
    with _BUILD_LOCK:
        if key not in _BUILT:
            _BUILT[key] = _build(spec, kwargs)
        return _BUILT[key]


def _hermes(text: str):
    calls, kept, at = [], [], 0
    for m in _CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
            name, args = obj["name"], obj.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError(name)
        except (ValueError, KeyError, TypeError):
            continue                        # not a call: stays text
        kept.append(text[at:m.start()])
        at = m.end()
        calls.append({"name": name, "arguments": args})
    kept.append(text[at:])
    return "".join(kept).strip(), calls


def _resolve_parser(spec: str) -> Callable:
    if spec == "hermes":
        return _hermes
    if spec == "none":
        return lambda text: (text, [])
    if ":" not in spec:
        raise DataError(f"task.env_args.tool_parser={spec!r}: not hermes, none, 'file.py:fn' or "
                        f"'module:fn'")
    from orchestrator.data.rewards import load_user_object
    return load_user_object(spec, "task.env_args.tool_parser", "function")


# ---------------------------------------------------------------------------- the client
class _Completions:
    def __init__(self, episode: "VerifiersEnv"):
        self.create = episode._create


class _Chat:
    def __init__(self, episode: "VerifiersEnv"):
        self.completions = _Completions(episode)


class _Client:
    """Shaped like `openai.AsyncOpenAI` as far as verifiers' rollouts use it."""

    def __init__(self, episode: "VerifiersEnv"):
        self.chat = _Chat(episode)
        self.base_url = "in-process://orchestrator"


def _same(was: dict, now: dict) -> bool:
    """The same message (an assistant turn: the same text; its tool calls are ours anyway)."""
    if was.get("role") == "assistant":
        return now.get("role") == "assistant" and (was.get("content") or "") == (now.get("content") or "")
    return all(was.get(k) == now.get(k) for k in ("role", "content", "tool_call_id"))


def _plain(msg: dict) -> dict:
    """A reply message for the runner: role, content and the like, without empty fields."""
    return {k: v for k, v in dict(msg).items() if v is not None and k != "tool_calls"}


# ---------------------------------------------------------------------------- the environment
class VerifiersEnv(Environment):
    _ids = itertools.count()

    def __init__(self, env: str = "", tool_parser: str = "hermes", **env_kwargs):
        self.spec, self.parser_spec, self.env_kwargs = str(env), str(tool_parser), env_kwargs
        self.vf_env: Any = None
        self.tools: Optional[list[dict]] = None
        self._parse: Callable = _hermes
        self._events: Optional[asyncio.Queue] = None
        self._reply: Optional[asyncio.Future] = None
        self._task: Optional[asyncio.Task] = None
        self._seen: list[dict] = []             # the conversation of the last create() call
        self._sent: Optional[dict] = None       # the assistant message we answered it with
        self._failure: Optional[BaseException] = None
        self._state: Any = None
        self._call_ids = f"call_{next(self._ids)}"

    # ------------------------------------------------------------------ rows -> verifiers input
    def _input(self, row: dict) -> dict:
        prompt = row.get("prompt", row.get("question"))
        if isinstance(prompt, str):
            messages = [*self._system(), *(getattr(self.vf_env, "few_shot", None) or []),
                        {"role": "user", "content": prompt}]
        elif isinstance(prompt, list):
            messages = [dict(m) for m in prompt]
            if not messages or messages[0].get("role") != "system":
                messages = [*self._system(), *messages]
        else:
            raise DataError(f"the row has no 'prompt' (chat messages or a string) or 'question' "
                            f"column (columns: {', '.join(row)})")
        info, answer = row.get("info"), row.get("answer")
        return {"prompt": messages, "answer": "" if answer is None else answer,
                "task": row.get("task") or getattr(self.vf_env, "env_id", "") or "default",
                "info": {} if info is None else info, "example_id": row.get("example_id") or 0}

    def _system(self) -> list[dict]:
        system = getattr(self.vf_env, "system_prompt", None)
        return [{"role": "system", "content": system}] if system else []

    # ------------------------------------------------------------------ the contract
    async def reset(self, row: dict) -> list[dict]:
        if not self.spec:
            raise DataError("task.env=verifiers needs task.env_args.env: 'file.py:load_environment', "
                            "'module:fn' or an installed verifiers environment's id")
        self._parse = _resolve_parser(self.parser_spec)
        loop = asyncio.get_running_loop()
        self.vf_env = await loop.run_in_executor(None, load, self.spec, self.env_kwargs)
        pool = None if isinstance(self._pool, cf.ProcessPoolExecutor) else self._pool  # threads: EnvPool
        _TOOL_POOL.set(pool)                     # the rollout task inherits it (a context copy)
        self._events = asyncio.Queue()
        self._task = asyncio.ensure_future(self._drive(self._input(row)))
        kind, payload = await self._events.get()
        if kind == "turn":
            return payload
        self._raise_failure()
        err = self._state.get("error") if self._state is not None else None
        raise RuntimeError("the verifiers rollout ended before asking the model anything"
                           + (f" ({type(err).__name__}: {err})" if err is not None else ""))

    async def step(self, turn: ModelTurn) -> StepResult:
        if self._reply is None:
            raise RuntimeError("step() without a pending model call")
        reply, self._reply = self._reply, None
        reply.set_result(self._response(turn))
        kind, payload = await self._events.get()
        if kind == "turn":
            return StepResult(payload, False, {"tool_calls": float(sum(m.get("role") == "tool"
                                                                       for m in payload))})
        self._raise_failure()
        return StepResult(done=True)

    async def score(self, transcript: list[dict]) -> float:
        if self._state is None:
            raise RuntimeError("score() before the verifiers rollout ended")
        rubric = self.vf_env.rubric
        if not getattr(self.vf_env, "score_rollouts", True):
            await rubric.dummy_score_rollout(self._state)
        elif "score_sem" in inspect.signature(rubric.score_rollout).parameters:    # 0.1.8, 0.1.9
            await rubric.score_rollout(self._state, score_sem=contextlib.nullcontext())
        else:
            await rubric.score_rollout(self._state)
        return float(self._state["reward"])

    async def close(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ------------------------------------------------------------------ the rollout side
    async def _drive(self, vf_input: dict) -> None:
        try:
            self._state = await self.vf_env.rollout(vf_input, _Client(self), MODEL, {})
        except asyncio.CancelledError:
            raise
        except Exception as exc:           # noqa: BLE001 - handed to step() on the runner's side
            self._failure = self._failure or exc
        self._events.put_nowait(("end", None))

    def _raise_failure(self) -> None:
        if self._failure is not None:
            exc = self._failure
            raise (exc if isinstance(exc, ConversationRewritten) else
                   RuntimeError(f"the verifiers rollout raised {type(exc).__name__}: {exc}"))

    async def _create(self, *, model: str = MODEL, messages: list, tools: Optional[list] = None,
                      **sampling) -> ChatCompletion:
        try:
            new = self._appended(list(messages))
        except ConversationRewritten as exc:
            self._failure = exc
            raise
        if self._reply is not None:
            self._failure = RuntimeError("the verifiers environment asked for two model turns at once")
            raise self._failure
        if self._sent is None and tools:
            self.tools = list(tools)
        self._seen = list(messages)
        self._reply = asyncio.get_running_loop().create_future()
        self._events.put_nowait(("turn", new))
        return await self._reply

    def _appended(self, messages: list) -> list[dict]:
        """The messages `messages` adds to the previous call's conversation and our reply."""
        if self._sent is None:
            return [_plain(m) for m in messages]
        n = len(self._seen)
        before = [*self._seen, self._sent]
        at = next((i for i, (a, b) in enumerate(zip(before, messages)) if not _same(a, b)),
                  None if len(messages) >= len(before) else len(messages))
        if at is not None:
            got = messages[at] if at < len(messages) else "(nothing)"
            raise ConversationRewritten(
                f"the verifiers environment rewrote the conversation at message {at} (was "
                f"{str(before[at])[:80]}, now {str(got)[:80]}): trajectories here are append-only, "
                f"each model turn must see the previous conversation plus the model's reply plus "
                f"new messages")
        return [_plain(m) for m in messages[n + 1:]]

    def _parsed(self, text: str) -> tuple[str, list[dict]]:
        out = self._parse(text)
        ok = (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], (str, type(None)))
              and isinstance(out[1], list) and all(
                  isinstance(c, dict) and isinstance(c.get("name"), str)
                  and isinstance(c.get("arguments", {}), (dict, str)) for c in out[1]))
        if not ok:
            raise TypeError(f"tool_parser={self.parser_spec!r} returned {out!r}"[:200] + ", not "
                            "(content, [{'name': str, 'arguments': dict or JSON text}, ...])")
        return out[0] or "", [{"name": c["name"], "arguments": c.get("arguments", {})} for c in out[1]]

    def _response(self, turn: ModelTurn) -> ChatCompletion:
        content, calls = self._parsed(turn.text)
        tool_calls = [{"id": f"{self._call_ids}_{uuid.uuid4().hex[:8]}", "type": "function",
                       "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(
                           c["arguments"], str) else json.dumps(c["arguments"])}} for c in calls]
        finish = "tool_calls" if tool_calls else ("stop" if turn.stopped else "length")
        message = {"role": "assistant", "content": content or None,
                   **({"tool_calls": tool_calls} if tool_calls else {})}
        self._sent = {"role": "assistant", "content": content or ""}
        return ChatCompletion.model_validate({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": MODEL,
            "choices": [{"index": 0, "finish_reason": finish, "message": message, "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(turn.ids),
                      "total_tokens": len(turn.ids)}})
