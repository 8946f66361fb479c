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
LAYERS = [["shm"], ["config", "messages", "errors", "wire"], ["run"], ["data"], ["envs"], ["algo"],
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
