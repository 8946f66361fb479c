"""The docs: the site builds with `mkdocs build --strict` (broken links and pages left out of the
nav fail), the README stays short and links only to pages that exist, every page opens with a
command whose launches are valid configs, the generated files (the picture, docs/index.md) match
their generator, and every row of the troubleshooting table gives the exit code and message it
shows. tests/integration/test_docs_commands.py runs each opening command for real (slow)."""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest

from scripts import docs_assets
from tests.docs_pages import (DOCS, GENERATED, ROOT, launch_args, nav_pages, opening,
                              split_config)


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "troubleshooting" / "index.html").exists()


def test_every_page_is_in_the_nav_and_opens_with_a_command():
    pages = nav_pages()
    on_disk = sorted(p.name for p in DOCS.glob("*.md"))
    assert sorted(pages) == on_disk
    for page in pages:
        if page not in GENERATED:
            assert opening(page).command.strip(), page


def test_the_generated_files_match_their_generator():
    assert (DOCS / "img" / "processes.svg").read_text() == docs_assets.svg(), \
        "run python scripts/docs_assets.py"
    assert (DOCS / "index.md").read_text() == docs_assets.index(), "run python scripts/docs_assets.py"


def test_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#]+)", text)
    assert "docs/img/processes.svg" in links
    assert {l for l in links if not (ROOT / l).exists()} == set()
    pages = {l.removeprefix("docs/") for l in links if l.endswith(".md")}
    assert pages == set(nav_pages()) - {"index.md"}       # every page, from the README
    # the two commands are the install page's and the testing page's openings
    assert opening("install.md").command in text and opening("testing.md").command in text


def test_every_opening_launch_is_a_valid_config(monkeypatch):
    from orchestrator.config import load_config
    monkeypatch.chdir(ROOT)
    seen = 0
    for page in nav_pages():
        if page in GENERATED:
            continue
        for args in launch_args(opening(page).command):
            config, overrides = split_config(args)
            if opening(page).exit_code == 0:
                load_config(config, overrides)
            seen += 1
    assert seen >= 12


def _rows():
    text = (DOCS / "troubleshooting.md").read_text()
    table = text.split("| overrides |", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        overrides = re.match(r"`([^`]*)`(.*)", cells[0])
        message = cells[2].strip("`")
        yield overrides.group(1).split(), overrides.group(2).strip(), int(cells[1]), message


def test_troubleshooting_rows_give_their_exit_code_and_message(monkeypatch, tmp_path):
    from orchestrator.launch import main
    monkeypatch.chdir(ROOT)
    rows = list(_rows())
    assert len(rows) >= 15
    first = opening("troubleshooting.md")
    for i, (overrides, condition, code, message) in enumerate(rows):
        run_dir = tmp_path / f"r{i}"
        if condition:           # "(on a run directory that holds a run)"
            run_dir.mkdir()
            (run_dir / "metrics.jsonl").write_text('{"kind": "step", "step": 1}\n')
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main([*overrides, f"run.dir={run_dir}"])
        lines = [l for l in err.getvalue().splitlines() if l.startswith("error:")]
        pattern = re.escape(message).replace(r"\.\.\.", ".*").replace(re.escape("'runs/default'"), "'.*'")
        assert rc == code and len(lines) == 1 and re.match(pattern, lines[0]), (overrides, err.getvalue())
        if overrides == launch_args(first.command)[0]:
            assert rc == first.exit_code and lines == first.prints


def test_every_top_level_entry_module_is_in_the_layout_page():
    """The thin top-level modules earn their place as documented `python -m` entry points."""
    page = (DOCS / "layout.md").read_text()
    rows = set(re.findall(r"`python -m orchestrator\.(\w+)", page))
    mains = {p.stem for p in (ROOT / "orchestrator").glob("*.py")
             if 'if __name__ == "__main__"' in p.read_text()}
    mains |= {p.parent.name for p in (ROOT / "orchestrator").glob("*/__main__.py")}
    assert mains == rows
