"""The house's rooms import downwards only (ARCHITECTURE.md "Layout as it grows"), read from the
source with `ast`: every `import` and `from ... import`, at module level or inside a function.

Layers, bottom to top: shm < config/messages/errors/wire < run < data < envs < algo < observe < loop
< runtime (with backends: the engines its workers drive) < the entry modules (launch and the thin
`python -m` modules). One exception is named: `data/workload.py`, the workload builder, assembles
the environment too (envs import data's tokens and rewards, never the builder).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [["shm"], ["config", "config_reference", "messages", "errors", "wire"], ["run"], ["data"], ["envs"], ["algo"],
          ["observe"], ["loop"], ["runtime", "backends"],
          ["launch", "audit", "export", "report", "inspect", "gate", "__init__"]]
LEVEL = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
ALLOWED_UP = {("orchestrator/data/workload.py", "envs")}


def room_of(module: str) -> str:
    parts = module.split(".")
    return "shm" if parts[0] == "shm" else (parts[1] if len(parts) > 1 else "__init__")


def imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "orchestrator":
                yield from (f"orchestrator.{a.name}" for a in node.names)
            else:
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def violations() -> list[str]:
    bad = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        src = room_of(rel[:-3].replace("/", "."))
        for mod in imports(path):
            if mod.split(".")[0] not in ("orchestrator", "shm"):
                continue
            dst = room_of(mod)
            assert src in LEVEL and dst in LEVEL, f"{rel}: room {src!r} or {dst!r} has no layer"
            if LEVEL[dst] > LEVEL[src] and (rel, dst) not in ALLOWED_UP:
                bad.append(f"{rel} imports {mod} ({src} -> {dst}, upward)")
    return bad


def test_every_import_goes_down():
    assert violations() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The check itself can fail: a loop module that imports the runtime is caught."""
    fake = tmp_path / "orchestrator" / "loop"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("def f():\n    from orchestrator.runtime import supervisor\n")
    (tmp_path / "orchestrator" / "run").mkdir()
    (tmp_path / "orchestrator" / "run" / "ok.py").write_text("from orchestrator import config\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations() == ["orchestrator/loop/bad.py imports orchestrator.runtime (loop -> runtime, upward)"]


def test_the_environment_contract_imports_no_environment():
    """envs/base.py (the contract) imports none of the environments the registry names, not even
    lazily (it did: base -> lookup -> base, a cycle); envs/registry.py does."""
    assert [m for m in imports(ROOT / "orchestrator/envs/base.py") if m.startswith("orchestrator.envs")] == []
    assert "orchestrator.envs.lookup" in set(imports(ROOT / "orchestrator/envs/registry.py"))


def _module_path(module: str, root: Path):
    base = root / Path(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def import_graph(root=None) -> dict[str, set[str]]:
    """module -> the house's modules it imports (at module level or in a function; `from pkg import
    name` counts as importing pkg.name where that is a module)."""
    root = root or ROOT
    graph: dict[str, set[str]] = {}
    for path in sorted([*(root / "orchestrator").rglob("*.py"), *(root / "shm").rglob("*.py")]):
        module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
        module = module.removesuffix(".__init__")
        out = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
                targets = [n for n in names if _module_path(n, root)] or [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            out.update(t for t in targets if t.split(".")[0] in ("orchestrator", "shm")
                       and _module_path(t, root) and t != module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    """No two modules import each other, directly or round a longer circle (issue #36), not even
    lazily inside a function: the shared names live in the room both use."""
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_a_lazy_circle(tmp_path):
    pkg = tmp_path / "orchestrator" / "backends"
    pkg.mkdir(parents=True)
    (tmp_path / "orchestrator" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from orchestrator.backends import b\n")
    (pkg / "b.py").write_text("def f():\n    from orchestrator.backends.c import g\n")
    (pkg / "c.py").write_text("import orchestrator.backends.a\n")
    (tmp_path / "shm").mkdir()
    assert cycles(import_graph(tmp_path)) == [["orchestrator.backends.a", "orchestrator.backends.b",
                                              "orchestrator.backends.c"]]


MAX_LINES = 450                 # issue #36: no source file past ~450 lines


def test_no_source_file_grows_past_the_limit():
    over = {}
    for path in sorted([*(ROOT / "orchestrator").rglob("*.py"), *(ROOT / "shm").rglob("*.py"),
                        *(ROOT / "scripts").glob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            over[rel] = n
    assert over == {}, f"source files past {MAX_LINES} lines (split them by role): {over}"
