"""Every docs page's opening command runs as the page shows it and prints what the page says
(tests/docs_pages.py reads them). Slow: together they are the default job several times over.

What changes from the pasted command: a `pip install ... &&` in front is left out (the test's
environment is installed already: the extra it names must import), run directories go under the
test's tmp_path (`runs/` there), a launch without a run.dir gets one there, and the Ray page's
cluster listens on a free port. Printed lines are compared up to their first digit (figures vary
by machine; the words around them do not). The testing page's command is the test suite itself
and is what CI runs; it is not run from inside it."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess

import pytest

from tests.docs_pages import GENERATED, ROOT, nav_pages, opening, stem

PAGES = [p for p in nav_pages() if p not in GENERATED and p != "testing.md"]
NEEDS = {"lora.md": "peft", "agents.md": "aiohttp", "vllm.md": "vllm", "ray.md": "ray"}
MARKS = {"vllm.md": [pytest.mark.vllm], "ray.md": [pytest.mark.ray]}


def _command(page: str, tmp_path) -> str:
    parts = re.split(r"(&&|;)", opening(page).command)
    steps = zip(parts[0::2], parts[1::2] + [""])        # each command with the separator after it
    kept = []
    for part, sep in steps:
        if part.strip().startswith("pip install"):    # installed already; its && goes with it
            continue
        part = part.replace("runs/", f"{tmp_path}/runs/")
        if "orchestrator.launch" in part and "run.dir=" not in part:
            part = part.rstrip() + f" run.dir={tmp_path}/runs/default "
        kept.append(part + sep)
    command = "".join(kept).strip().rstrip("&;").strip()
    if page == "ray.md":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = command.replace("6379", str(port))
    return command


@pytest.mark.slow
@pytest.mark.parametrize("page", [pytest.param(p, marks=MARKS.get(p, [])) for p in PAGES])
def test_the_opening_command_runs_and_prints_what_the_page_says(page, tmp_path):
    if page in NEEDS:
        pytest.importorskip(NEEDS[page])
    if page == "ray.md" and not shutil.which("ray"):
        pytest.skip("no ray command")
    first = opening(page)
    out = subprocess.run(["bash", "-c", _command(page, tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=1500)
    text = (out.stdout + out.stderr).replace(f"{tmp_path}/", "")
    assert out.returncode == first.exit_code, text[-3000:]
    lines = [l.strip() for l in text.splitlines()]
    for want in first.prints:
        assert any(l.startswith(stem(want)) for l in lines), (want, text[-3000:])
