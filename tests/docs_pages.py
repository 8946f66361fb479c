"""The docs pages as the tests read them: the site's nav (mkdocs.yml), each page's opening command
and the lines it says that command prints. Shared by tests/unit/test_docs.py (cheap checks) and
tests/integration/test_docs_commands.py (runs each opening command)."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = {"index.md", "config.md"}        # the README's copy and the config reference


def nav_pages() -> list[str]:
    def walk(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from walk(v)
        elif isinstance(node, list):
            for v in node:
                yield from walk(v)
    return list(walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))


@dataclass(frozen=True)
class Opening:
    page: str
    command: str                 # the first ```bash block, as a user pastes it
    prints: list[str]            # the ```text block after it (lines, "..." elided)
    exit_code: int               # "prints (exit code N):", else 0


def opening(page: str) -> Opening:
    text = (DOCS / page).read_text()
    m = re.match(r"# [^\n]+\n\n```bash\n(.*?)\n```\n", text, re.S)
    assert m, f"{page} does not open with its title and a ```bash command"
    rest = text[m.end():]
    prints, code = [], 0
    p = re.match(r"\nprints \((?:exit code (\d+)|last lines[^)]*)\):\n\n```text\n(.*?)\n```\n", rest, re.S)
    if p:
        code = int(p.group(1) or 0)
        prints = [l for l in p.group(2).split("\n") if l.strip() and l.strip() != "..."]
    return Opening(page, m.group(1), prints, code)


def stem(line: str) -> str:
    """What of a printed line must stay as the page shows it: up to its first digit (figures
    move from run to run and machine to machine; the words that say what they are do not)."""
    m = re.search(r"\d", line)
    return (line[:m.start()] if m else line).strip()


def launch_args(command: str) -> list[list[str]]:
    """The argument lists of each `python -m orchestrator.launch` in a command line."""
    out = []
    for part in re.split(r"&&|;", command):
        words = shlex.split(part)
        if words[:3] == ["python", "-m", "orchestrator.launch"]:
            out.append(words[3:])
    return out


def split_config(args: list[str]) -> tuple[str | None, list[str]]:
    if "--config" in args:
        i = args.index("--config")
        return args[i + 1], args[:i] + args[i + 2:]
    return None, args
