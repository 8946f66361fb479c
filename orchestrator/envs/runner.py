"""Multi-turn episodes inside an inference worker: an environment thread beside the decode loop.

Contract: `EpisodeRunner(env_cls, env_args, renderer, tokens, rows, limits)`. The worker's main
thread calls `start(request_id, prompt_id, row, n, is_eval, temperature)` for a Generate (n episodes
of dataset row `row`), `requests()` for the model turns to put to the backend (`TurnRequest`: key,
the trajectory's ids so far, max new tokens), `turn_done(key, sequences)` with the backend's
one-row result of a turn, `ready()` for finished groups (`shm.codec.Sequences`, rewards and
scalars filled), `cancel(request_id)` (returns the turn keys to abort in the backend),
`running(request_id)` (started, not cancelled, not handed out yet), `settled()` (every episode
awaits a model turn or is over: run.deterministic steps the backend only then), `close()`.
With a `key` (run.deterministic), turn t of episode e carries `sample_key` key + (e, t) and the
environment's rng is keyed by key + (e, ENV_STREAM) instead of the runner's seed sequence.
Episodes are coroutines on the environment thread's asyncio loop; blocking calls run on a pool of
`task.env_workers` daemon threads (`envs.pool.EnvPool`; tools on processes with
`task.env_processes`), rendering and tokenizing on a thread of its own. The decode loop never waits
on an environment, and weights reload between decode steps, so later turns carry newer versions.

Hangs are bounded: a blocking call past `task.env_timeout_s` ends its episode (limited) and its pool
thread is replaced, so other episodes keep their pool. `hung(max_stuck)` (`envs.watch.LoopWatch`:
the loop's own liveness stamp), called by the worker's main thread, names the environment when its
loop stalls or abandoned calls pile up; the worker then acts per `task.env_on_hang`. `close()` is
bounded, and waits neither for a stalled loop nor for a stuck call.

A trajectory is one id list built only by appending: the opening (loss mask 0), each turn's sampled
ids verbatim with their logprobs and versions (mask 1), each rendered reply (mask 0); a turn's
prompt is exactly the ids so far. An episode ends when the environment says done, or by a limit,
with reward 0 and a counted reason: `task.max_turns` model turns, `task.max_episode_tokens` in all
(a turn gets at most the tokens left, a reply that would pass the limit is not appended), a call
past `task.env_timeout_s`, or a reply the renderer cannot append (`AppendError`: rejected). A reply
is measured against the tokens left before it is tokenized (`TurnRenderer`'s `budget`): one that
cannot fit ends the episode (limited) without being tokenized. A rejected episode is not trained:
its ids are all context (loss mask 0, version -1, logprob 0: its turns were sampled for a
conversation the template would not show the model again), so the train sink leaves it out of its
group's baseline too. An environment call that raises fails the run naming the environment and the
row (`BadEnvOutput`, exit 2) unless `task.env_on_error: zero` (reward 0, counted as reward_errors).
A group is handed out only when all its episodes ended, so an episode in flight at a crash is redone
whole.

`scalars` of a finished group (summed over its episodes, except TURNS_MAX): `envs.base.SCALARS`.

An agent task (`task.agent`) passes `agent` (`envs.agent.AgentEpisodes`) and no environment class:
its `open(runner)` runs on the loop at construction (the endpoint starts), its `episode(runner,
group, ep)` is each episode's body instead of reset/step/score (with `generate`, `rendered`,
`call`, `reward`, `where`, `watching` and `Ended` / `EnvError`, as the environment's body uses them),
and its `aclose()` runs at `close()`. A turn whose episode stops waiting for it (cancelled: a client
gone, a call past its timeout) is aborted: its key comes out of `aborts()`. An agent episode may
leave other branches (`ep.extra`, `envs.agent_session`): a training group then holds them after its
episodes' sequences, each with its episode's reward (`scalars[BRANCHES]` counts them; a rejected
episode's are dropped); an eval group holds each episode's first branch only.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import inspect
import multiprocessing as mp
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from orchestrator.data.reward_pool import BadEnvOutput
from orchestrator.data.tokens import ModelTokens
from orchestrator.envs.episodes import (ENV_STREAM, Ended, EnvError,  # noqa: F401  (re-exported)
                                        env_episode, group_record)
from orchestrator.envs.pool import EnvPool
from orchestrator.envs.render import TurnRenderer
from orchestrator.envs.watch import LoopWatch
from shm.codec import Sequences

KEY_BASE = 1 << 60          # backend request ids of turns: above any supervisor request id
CLOSE_TIMEOUT_S = 5.0


@dataclass
class Limits:
    max_turns: int
    max_new_tokens: int          # per turn
    max_episode_tokens: int
    timeout_s: float
    on_error: str                # "fail" | "zero"
    workers: int
    processes: bool = False


@dataclass
class TurnRequest:
    key: int
    prompt_id: int
    ids: np.ndarray
    max_new_tokens: int
    temperature: float
    eval: bool
    sample_key: tuple = ()       # run.deterministic: the group's key + (episode, turn)


@dataclass
class _Episode:
    env: Any
    index: int = 0                       # its place in the group
    asked: int = 0                       # turns put to the backend so far
    ids: list = field(default_factory=list)
    mask: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    versions: list = field(default_factory=list)
    prompt_len: int = 0
    turns: int = 0
    env_s: float = 0.0
    gen_s: float = 0.0
    tool_calls: float = 0.0
    reward: float = 0.0
    ended: Optional[str] = None          # limited / rejected / error
    extra: list = field(default_factory=list)   # an agent episode's other branches (branches.Branch)


@dataclass
class _Group:
    request_id: int
    prompt_id: int
    row: int
    is_eval: bool
    temperature: float
    n: int
    key: tuple = ()                      # run.deterministic: Generate.key (keys turns and env rng)
    task: Optional[asyncio.Future] = None
    keys: set = field(default_factory=set)
    ended: int = 0                       # episodes over


class EpisodeRunner:
    def __init__(self, env_cls: Optional[type], env_args: dict, renderer: TurnRenderer,
                 tokens: ModelTokens, rows: Callable[[bool, int], dict], limits: Limits, name: str,
                 seed: int, agent: Any = None):
        self.env_cls, self.env_args, self.renderer, self.tokens = env_cls, dict(env_args), renderer, tokens
        self.agent = agent
        self.rows, self.limits, self.name = rows, limits, name
        self.seeds = np.random.SeedSequence(seed)
        self._requests: "queue.SimpleQueue[TurnRequest]" = queue.SimpleQueue()
        self._done: "queue.SimpleQueue[tuple[int, Any]]" = queue.SimpleQueue()
        self._aborts: "queue.SimpleQueue[int]" = queue.SimpleQueue()
        self._turns: dict[int, tuple[asyncio.Future, float]] = {}   # key -> (future, submit time)
        self._groups: dict[int, _Group] = {}
        self._next_key = KEY_BASE
        self._lock = threading.Lock()
        self.calls = EnvPool(limits.workers, "env-call")        # blocking environment calls
        self.pool: cf.Executor = (                                # tools (Environment.run_tool)
            cf.ProcessPoolExecutor(limits.workers, mp_context=mp.get_context("spawn"))
            if limits.processes else self.calls)
        self.render = EnvPool(1, "env-render")       # one thread: tokenizers are not thread-safe
        self._live = weakref.WeakKeyDictionary()   # async call's task -> (what, its group), for hung()
        self._hangs: "queue.SimpleQueue[tuple[int, int, str]]" = queue.SimpleQueue()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="env", daemon=True)
        self.watch = LoopWatch(self.loop, self._thread, self.calls, limits.timeout_s, name, self._calling)
        self._thread.start()
        if agent is not None:       # its endpoint serves on this loop (envs.agent)
            try:
                asyncio.run_coroutine_threadsafe(agent.open(self), self.loop).result(CLOSE_TIMEOUT_S)
            except BaseException:
                self.close()
                raise

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self.watch.tick)
        self.loop.run_forever()

    # ------------------------------------------------------------------ main-thread side
    def start(self, request_id: int, prompt_id: int, row: int, n: int, is_eval: bool,
              temperature: float, key: tuple = ()) -> None:
        g = _Group(request_id, prompt_id, row, is_eval, temperature, n, tuple(key))
        with self._lock:
            self._groups[request_id] = g
        g.task = asyncio.run_coroutine_threadsafe(self._group(g), self.loop)

    def requests(self) -> list[TurnRequest]:
        return _drain(self._requests)

    def settled(self) -> bool:
        """Whether every episode here awaits a model turn or is over: nothing the environment
        thread does can add a turn before one of those is answered. run.deterministic steps the
        backend only then, so which turns share a forward pass follows from the run alone."""
        with self._lock:
            waiting: dict[int, set] = {}        # request id -> its episodes with a turn pending
            for _, _, g, i in self._turns.values():
                waiting.setdefault(g.request_id, set()).add(i)
            return all(len(waiting.get(rid, ())) + g.ended == g.n for rid, g in self._groups.items())

    def aborts(self) -> list[int]:
        """Keys of turns whose episodes stopped waiting for them (to abort in the backend); drained
        after `requests()`, so that a turn is added before its abort."""
        return _drain(self._aborts)

    def turn_done(self, key: int, seqs: Sequences) -> None:
        p = int(seqs.prompt_lens[0])
        sl = seqs.seq(0)
        ids = [int(t) for t in seqs.tokens[sl][p:]]
        turn = (ids, seqs.logprobs[sl][p:].tolist(), seqs.versions[sl][p:].tolist())
        with self._lock:
            fut, t0, _, _ = self._turns.pop(key, (None, 0.0, None, 0))
        if fut is not None:
            self.loop.call_soon_threadsafe(_resolve, fut, (turn, time.monotonic() - t0))

    def cancel(self, request_id: int) -> list[int]:
        """Stop a group's episodes; the backend turn keys to abort."""
        with self._lock:
            g = self._groups.pop(request_id, None)
            keys = sorted(g.keys) if g is not None else []
            for k in keys:
                self._turns.pop(k, None)
        if g is not None and g.task is not None:
            g.task.cancel()
        return keys

    def running(self, request_id: int) -> bool:
        """Whether the group is still here: started, not cancelled, not handed out by `ready()`."""
        with self._lock:
            return request_id in self._groups

    def busy(self) -> bool:
        return bool(self._groups)

    def hung(self, max_stuck: int) -> Optional[str]:
        """One line naming the environment if its loop stalled or more than `max_stuck` abandoned
        blocking calls still run (`envs.watch`); None while healthy. A stall is also a hang of the
        row whose call blocks the loop (`hang_reports`)."""
        line = self.watch.hung(max_stuck)
        if line is not None and self.watch.stalled():     # the worker acts on the first line
            _, _, g = self._current()
            if g is not None:
                self._hang(g, line)
        return line

    def hang_reports(self) -> list[tuple[int, int, str]]:
        """(train row, prompt id, the line naming the environment, the call and the row) of each
        hang since the last call: a blocking call abandoned past task.env_timeout_s, or the call
        blocking the loop (`hung`). The worker's main thread sends each as `messages.EnvHung`."""
        return _drain(self._hangs)

    def _hang(self, g: "_Group", why: str) -> None:
        if not g.is_eval:
            self._hangs.put((g.row, g.prompt_id, why))

    def watching(self, task: asyncio.Task, what: str, g: Optional["_Group"] = None) -> None:
        """Name `task` (an async call running on the loop, of group `g`'s episodes) in `hung()`
        should it block the loop."""
        self._live[task] = (what, g)

    def _calling(self) -> Optional[tuple[str, str]]:
        """The async environment call running on the loop now: (what, the file of its code)."""
        task, what, _ = self._current()
        return None if what is None else (what, task.get_coro().cr_code.co_filename)

    def _current(self) -> tuple[Optional[asyncio.Task], Optional[str], Optional["_Group"]]:
        """The task running on the loop now, and what `watching` named it: (task, what, group)."""
        task = asyncio.current_task(self.loop)
        what, g = self._live.get(task, (None, None)) if task is not None else (None, None)
        return task, what, g

    def ready(self) -> list[Sequences]:
        """Finished groups; raises BadEnvOutput for a failed one (task.env_on_error=fail)."""
        out = []
        while True:
            try:
                rid, result = self._done.get_nowait()
            except queue.Empty:
                return out
            with self._lock:
                if self._groups.pop(rid, None) is None:
                    continue                    # cancelled meanwhile
            if isinstance(result, BaseException):
                raise result
            out.append(result)

    def close(self) -> None:
        """Cancel every episode and let them close their environments (bounded), then stop."""
        async def shutdown() -> None:
            if self.agent is not None:          # its endpoint first: no call starts after this
                try:
                    await asyncio.wait_for(self.agent.aclose(), CLOSE_TIMEOUT_S)
                except Exception:           # noqa: BLE001 - closing anyway
                    pass
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)

            self.loop.call_soon(self.loop.stop)     # after this task's result is handed out

        self._groups.clear()
        if self._thread.is_alive():
            done = asyncio.run_coroutine_threadsafe(shutdown(), self.loop)
            if not self.watch.stalled():        # a stalled loop shuts down once its call returns
                try:
                    done.result(CLOSE_TIMEOUT_S + 1)
                except Exception:           # noqa: BLE001 - closing anyway
                    self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(CLOSE_TIMEOUT_S)
        for pool in {self.pool, self.calls, self.render}:
            pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ environment thread
    async def _group(self, g: _Group) -> None:
        tasks = [asyncio.ensure_future(self._episode(g, i)) for i in range(g.n)]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:          # cancel(): every episode stops, its env closes
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        for t in pending:                       # a failed episode fails the group at once
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        failed = [t.exception() for t in done if t.exception() is not None]
        # BadEnvOutput, or a bug: reported by ready() on the worker's main thread
        self._done.put((g.request_id, failed[0] if failed else
                        group_record(g, [t.result() for t in tasks])))

    def where(self, g: _Group) -> str:
        kind = "eval row" if g.is_eval else "row"
        what = "environment" if self.agent is None else "agent"
        return f"{what} {self.name!r} for {kind} {g.row} (prompt {g.prompt_id})"

    async def call(self, g: _Group, ep: _Episode, what: str, fn, *args):
        """One environment call under the timeout; its time counts as environment time."""
        t0 = time.monotonic()
        try:
            label = f"{what} of {self.where(g)}"
            if inspect.iscoroutinefunction(fn):
                coro = asyncio.ensure_future(fn(*args))
                self._live[coro] = (label, g)
                result = await asyncio.wait_for(coro, self.limits.timeout_s)
            else:       # timed from its start by the pool's sweep (queue time excluded): a stuck
                        # one fails with TimeoutError and its thread is replaced: a hang of the row
                try:
                    result = await asyncio.wrap_future(self.calls.call(label, fn, *args))
                except TimeoutError:
                    self._hang(g, f"{label} ran longer than task.env_timeout_s="
                                  f"{self.limits.timeout_s:g} (abandoned, its thread still in it)")
                    raise
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, self.limits.timeout_s)
            return result
        except (asyncio.TimeoutError, TimeoutError):
            raise Ended("limited") from None
        except (asyncio.CancelledError, Ended):
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise EnvError(f"{self.where(g)}: {what} raised {why}") from None
        finally:
            ep.env_s += time.monotonic() - t0

    async def rendered(self, fn, *args):
        """A renderer call on the render thread (tokenizing a long text never stalls the loop)."""
        return await asyncio.wrap_future(self.render.call("render", functools.partial(fn, *args)))

    async def generate(self, g: _Group, ep: _Episode, max_new: int) -> tuple:
        fut = self.loop.create_future()
        i = ep.index
        sample_key = (*g.key, i, ep.asked) if g.key else ()     # (keys only run.deterministic,
        ep.asked += 1                                            # which refuses agents)
        with self._lock:        # the request is queued before the episode counts as waiting
            key, self._next_key = self._next_key, self._next_key + 1
            self._turns[key] = (fut, time.monotonic(), g, i)
            g.keys.add(key)
            self._requests.put(TurnRequest(key, g.prompt_id, np.asarray(ep.ids, np.int32), max_new,
                                           g.temperature, g.is_eval, sample_key))
        try:
            turn, gen_s = await fut
        except asyncio.CancelledError:          # nobody waits for it any more: abort it
            with self._lock:
                pending = self._turns.pop(key, None) is not None
            if pending:
                self._aborts.put(key)
            raise
        finally:
            with self._lock:
                g.keys.discard(key)
        ep.gen_s += gen_s
        return turn

    def reward(self, g: _Group, what: str, reward) -> float:
        """`reward` as a float, or EnvError naming `what` returned it."""
        if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, (int, float, np.number)) \
                or not np.isfinite(float(reward)):
            raise EnvError(f"{self.where(g)}: {what} returned {reward!r}"[:200] + ", not a finite number")
        return float(reward)

    async def _episode(self, g: _Group, i: int) -> _Episode:
        ep = _Episode(None, index=i)
        try:
            body = env_episode if self.agent is None else self.agent.episode
            ep.reward = await body(self, g, ep)
        except Ended as end:
            ep.ended, ep.reward = end.reason, 0.0
            if end.reason == "rejected":            # not trained (see the module docstring)
                n = len(ep.ids)
                ep.mask, ep.logprobs, ep.versions = [0] * n, [0.0] * n, [-1] * n
        except EnvError as exc:
            if self.limits.on_error == "fail":
                raise BadEnvOutput(str(exc)) from None
            ep.ended, ep.reward = "error", 0.0
        finally:
            try:
                close = getattr(ep.env, "close", None)
                if callable(close):
                    try:
                        await self.call(g, ep, "close()", close)
                    except (Ended, EnvError):
                        pass
            finally:
                with self._lock:
                    g.ended += 1
        return ep



def _drain(q: "queue.SimpleQueue") -> list:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def _resolve(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)
