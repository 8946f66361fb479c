"""Name -> function registries of the recipes: `registrar(table, what)` returns the decorator factory
that files a function under a name in `table` (a second function under the same name raises
ValueError naming `what`). Callers look names up in the table; none special-cases one."""
from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def registrar(table: dict, what: str) -> Callable[[str], Callable[[F], F]]:
    def register(name: str) -> Callable[[F], F]:
        def add(fn: F) -> F:
            if name in table:
                raise ValueError(f"{what} {name!r} is registered twice")
            table[name] = fn
            return fn
        return add
    return register
