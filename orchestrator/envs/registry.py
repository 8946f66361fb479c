"""The registry of environments: `resolve_env(spec)` -> the class `task.env` names.

A built-in name (`lookup`, `envs.lookup`; `verifiers`: environments written for the verifiers
library, `envs.verifiers_env`, loaded only when named) or `path.py:Class` / `module:Class` (loaded
like a user reward, `data.rewards.load_user_object`), checked to be a class with `reset`, `step` and
`score` (the contract in `envs.base`). A bad spec is a DataError naming `task.env` (exit 2).
Separate from `envs.base` so that the contract imports none of the environments that implement it.

`resolve_agent(spec)` -> the function `task.agent` names (`path.py:run` / `module:run`), checked to
be callable with `(row, base_url, api_key)`, and the HTTP stack the endpoint needs (aiohttp, the
`agent` extra) to be installed: a DataError naming `task.agent` otherwise (exit 2). A function
with a `notes` attribute (lines, e.g. `verifiers_agent`'s) has them printed as warnings at start
(`data.workload.load_prompts`).
"""
from __future__ import annotations

import importlib.util
import inspect

from orchestrator.data.tokens import DataError

BUILTIN = ("lookup", "verifiers")


def resolve_env(spec: str) -> type:
    """The environment class `task.env` names (see the module docstring)."""
    if spec == "lookup":
        from orchestrator.envs.lookup import LookupEnv
        return LookupEnv
    if spec == "verifiers":         # the adapter (and verifiers) load only when named; a missing or
        from orchestrator.envs.verifiers_env import VerifiersEnv    # unsupported one: DataError
        return VerifiersEnv
    if ":" not in spec:
        raise DataError(f"task.env={spec!r}: not a built-in ({', '.join(BUILTIN)}) and not "
                        f"'file.py:Class' or 'module:Class'")
    from orchestrator.data.rewards import load_user_object
    cls = load_user_object(spec, "task.env", "class")
    if not isinstance(cls, type):
        raise DataError(f"task.env={spec!r}: {spec.replace(':', '.')} is not a class")
    missing = [m for m in ("reset", "step", "score") if not callable(getattr(cls, m, None))]
    if missing:
        raise DataError(f"task.env={spec!r}: {cls.__name__} has no {', '.join(missing)} method")
    return cls


def resolve_agent(spec: str):
    """The agent function `task.agent` names (see the module docstring)."""
    from orchestrator.data.rewards import load_user_object
    if ":" not in spec:
        raise DataError(f"task.agent={spec!r}: not 'file.py:run' or 'module:run'")
    fn = load_user_object(spec, "task.agent", "function")
    if not callable(fn) or isinstance(fn, type):
        raise DataError(f"task.agent={spec!r}: {spec.replace(':', '.')} is not a function")
    try:
        inspect.signature(fn).bind("row", "base_url", "api_key")
    except TypeError as exc:
        raise DataError(f"task.agent={spec!r}: {getattr(fn, '__name__', spec)} cannot be called as "
                        f"run(row, base_url, api_key) ({exc})") from None
    except ValueError:          # no signature to read (a builtin): left to the call
        pass
    if importlib.util.find_spec("aiohttp") is None:
        raise DataError(f"task.agent={spec!r} needs aiohttp for its endpoint: pip install "
                        f"'async-rl-orchestrator[agent]'")
    return fn
