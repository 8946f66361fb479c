"""verifiers 0.4 (`verifiers.v1`) environments played over the agent endpoint (`task.agent`).

Contract: `verifiers_agent(env, model="policy") -> run`, an `async def run(row, base_url, api_key)
-> float` for `task.agent` (envs.agent): it plays ONE episode of the verifiers 0.4 `env` (a
`verifiers.v1.Env`: a Taskset + a Harness per agent seat) for `row`, every model call of its
harness going to this episode's OpenAI-compatible endpoint, and returns the episode's reward. A
user's agent file is two lines:

    from orchestrator.envs.verifiers_agent import verifiers_agent
    run = verifiers_agent(load_environment(...))        # any verifiers.v1.Env

- The row and the task: a row with an integer `idx` plays the env's own taskset's task at that
  position (`load()` order, the `idx` verifiers itself stamps on each task: what its rewards read is
  what its `load()` built); a row without `idx` IS the task data (validated as the taskset's
  `TaskData` subclass: `prompt` and the task's own fields, other columns ignored), with the
  taskset's task config and system prompt override. The taskset is read once, on the first `idx`
  row, on a thread (never on the environment loop); an infinite taskset has no positions: rows
  must then be task data.
- The endpoint and key: the episode's `ModelContext(model, EvalClientConfig(base_url, api_key_var))`.
  verifiers reads the key from the environment variable the client config names, when its
  interception server builds that config's client (during the episode). The variable is this
  episode's own (`ORCH_VF_KEY_<key>`, set for the episode's life, then removed): concurrent
  episodes of one process never share or overwrite one.
- Serving: each episode enters `serving()` on its own shallow copy of `env` (which shares the
  taskset, the harnesses and the config, never mutated): the interception server (127.0.0.1, an
  ephemeral port), its per-config clients and the taskset's shared tool servers live exactly as
  long as the episode. Measured on the tiny in-process harness: no slower than one serving held
  for the process (the cost is verifiers' per-rollout work), and nothing to close at the end of
  a run (`task.agent` has no teardown hook) nor growing with the episodes (verifiers keeps one
  client per distinct client config, and every episode's base URL is distinct). `env.serving()`
  itself sets attributes on the env, so concurrent episodes must not share one env object.
- The reward: `run_episode` returns an `Episode`; an episode that is not `ok` (its harness or
  scoring raised, its deadline passed) raises RuntimeError with verifiers' last error (an
  environment error, `task.env_on_error`; a call that our endpoint refused and that ended the
  episode, limited or rejected, decides the outcome first, envs.agent). The reward is that of
  the episode's one trainable trace (`trace.reward`: the weighted sum of its `@reward`s and
  judges); an episode with none or several trainable traces raises (one episode is one token
  trajectory here: several trainable agents cannot share it).
- Runtime: each agent seat must run locally (`runtime={"type": "subprocess"}` or a local
  container): verifiers' default runtime is Prime's remote sandbox, which reaches the interception
  through a tunnel (network): refused when the bridge is built. Offline, the harness must be one
  that runs where it is (verifiers' built-in `null` harness runs its chat loop as a `uv` script,
  which downloads its dependencies): an in-process `Harness` whose `launch()` calls the model
  through the `endpoint` + `secret` it is given and returns a `ProgramResult` (verifiers
  documents this in `Harness.launch`).
- Downloads: verifiers' built-in harnesses (`bash`, `null`, the coding agents) provision their
  program when an episode starts (`Harness.setup`: uv and the program's dependencies, fetched from
  the network). `verifiers_agent` says so for each such seat in `run.notes` (one line), which the
  launcher prints as a warning before the run starts: offline, their episodes fail.
- What breaks the append-only rule: verifiers retries (`retries.max_retries` > 0 on the env or a
  seat) replay an episode from its start, and a seat without a pinned client (a judge, a second
  agent) also calls this endpoint: those calls are rejected (400 `rejected`, not trained).

Imports verifiers only inside functions (an optional dependency, not in the main environment):
a missing one or one older than 0.4 is a RuntimeError naming it.
"""
from __future__ import annotations

import asyncio
import copy
import os
import threading
from typing import Any, Callable

MIN_VERSION = (0, 4)
KEY_VAR = "ORCH_VF_KEY_"


def _require_verifiers():
    """verifiers.v1, or a RuntimeError naming what is missing."""
    try:
        import verifiers
    except ImportError as exc:
        raise RuntimeError(f"verifiers_agent needs verifiers >= 0.4 (pip install 'verifiers>=0.4'): "
                           f"{exc}") from None
    text = getattr(verifiers, "__version__", "0")
    parts = tuple(int(p) for p in text.split("+")[0].split(".")[:2] if p.isdigit())
    if parts < MIN_VERSION:
        raise RuntimeError(f"verifiers_agent needs verifiers >= 0.4 (its verifiers.v1 API); "
                           f"verifiers {text} is installed")
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise RuntimeError(f"verifiers_agent needs verifiers.v1 (verifiers >= 0.4): {exc}") from None
    return vf


class _Bridge:
    """One env's episodes: the taskset's tasks (read once, for `idx` rows) and the episode body."""

    def __init__(self, vf, env, model: str):
        self.vf, self.env, self.model = vf, env, model
        self.task_cls = type(env.taskset).task_type()
        self._tasks: list | None = None
        self._lock = threading.Lock()

    def _all_tasks(self) -> list:
        with self._lock:                     # concurrent first episodes: one reads, the rest wait
            if self._tasks is None:
                if not self.env.taskset.bounded:
                    raise ValueError(f"{type(self.env.taskset).__name__} is infinite: a row's idx "
                                     f"names no position; give rows as task data (no idx)")
                self._tasks = list(self.env.taskset)
            return self._tasks

    async def task(self, row: dict):
        idx = row.get("idx") if isinstance(row, dict) else None
        if isinstance(idx, int) and not isinstance(idx, bool):
            tasks = self._tasks if self._tasks is not None else await asyncio.to_thread(self._all_tasks)
            if not 0 <= idx < len(tasks):
                raise ValueError(f"row idx={idx} is not a task of {type(self.env.taskset).__name__} "
                                 f"({len(tasks)} tasks)")
            return tasks[idx]
        if not isinstance(row, dict):
            raise TypeError(f"a row is a dict of task data, not {type(row).__name__}")
        from pydantic import ValidationError
        data_cls = self.task_cls.data_type()
        try:
            data = data_cls.model_validate(row)
        except ValidationError as exc:
            why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"the row is not {data_cls.__name__} ({why})") from None
        task = self.task_cls(data, self.env.taskset.config.task)
        prompt = self.env.taskset.system_prompt
        return task if prompt is None else task.with_data(system_prompt=prompt)

    def reward(self, episode) -> float:
        if not episode.ok:
            err = episode.last_error or next((e for t in episode.traces for e in t.errors), None)
            why = f"{err.type}: {err.message}" if err is not None else "no error recorded"
            raise RuntimeError(f"the verifiers episode failed ({why})".splitlines()[0][:400])
        trained = [t for t in episode.traces if t.agent is None or t.agent.trainable]
        if len(trained) != 1:
            raise RuntimeError(f"the verifiers episode has {len(trained)} trainable traces: one "
                               f"episode here is one token trajectory (one trainable agent)")
        return float(trained[0].reward)

    async def run(self, row: dict, base_url: str, api_key: str) -> float:
        vf = self.vf
        task = await self.task(row)
        var = KEY_VAR + api_key
        os.environ[var] = api_key                   # this episode's own variable: nothing shared
        try:
            ctx = vf.ModelContext(model=self.model, client=vf.EvalClientConfig(
                base_url=base_url, api_key_var=var))
            env = copy.copy(self.env)               # serving() sets attributes: one env per episode
            async with env.serving():
                episode = await env.run_episode(task, ctx)
        finally:
            os.environ.pop(var, None)
        return self.reward(episode)


def verifiers_agent(env: Any, model: str = "policy") -> Callable:
    """`run(row, base_url, api_key)` playing one episode of the verifiers 0.4 `env` (module doc)."""
    vf = _require_verifiers()
    if not isinstance(env, vf.Env):
        raise TypeError(f"verifiers_agent(env): a verifiers.v1.Env (e.g. vf.SingleAgentEnv(...)), "
                        f"not {type(env).__name__}")
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.runtimes import runtime_is_local
    remote = [f"{name} ({getattr(spec.runtime, 'type', type(spec.runtime).__name__)})"
              for name, spec in agent_config_fields(env.config).items()
              if not runtime_is_local(spec.runtime)]
    if remote:
        raise ValueError(f"verifiers_agent: the env's agent seats {', '.join(remote)} run in a remote "
                         f"runtime, which reaches the model through a tunnel: run them locally "
                         f"(agent=vf.AgentConfig(runtime={{'type': 'subprocess'}}))")
    bridge = _Bridge(vf, env, model)

    async def run(row, base_url: str, api_key: str) -> float:
        return await bridge.run(row, base_url, api_key)

    run.bridge = bridge
    run.notes = _download_notes(env)
    return run


def _download_notes(env) -> tuple[str, ...]:
    """One line naming the seats whose harness is one of verifiers' own that provisions its program
    when an episode starts (`setup()`: uv and the program's dependencies, or its installer, fetched
    from the network), so that offline the run's first episodes fail."""
    from verifiers.v1.harness import Harness
    seats = [f"{name} ({h.config.id}: {type(h).__name__})"
             for name, h in getattr(env, "_harnesses", {}).items()
             if type(h).__module__.startswith("verifiers.") and type(h).setup is not Harness.setup]
    if not seats:
        return ()
    return (f"verifiers_agent: agent seat {', '.join(seats)} runs a built-in verifiers harness that "
            f"downloads its program when an episode starts (uv and its dependencies, from the "
            f"network): offline every episode fails; an in-process Harness (its launch() calling "
            f"the endpoint it is given) downloads nothing",)
