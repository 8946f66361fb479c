"""The registry of environments: `resolve_env(spec)` -> the class `task.env` names.

A built-in name (`lookup`, `envs.lookup`; `verifiers`: environments written for the verifiers
library, `envs.verifiers_env`, loaded only when named) or `path.py:Class` / `module:Class` (loaded
like a user reward, `data.rewards.load_user_object`), checked to be a class with `reset`, `step` and
`score` (the contract in `envs.base`). A bad spec is a DataError naming `task.env` (exit 2).
Separate from `envs.base` so that the contract imports none of the environments that implement it.
"""
from __future__ import annotations

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
