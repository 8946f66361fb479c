"""docs/config.md is `python -m orchestrator.config --reference`'s output (issue #36): every key of
the typed config with its type, default, bounds and description; a key added, renamed or
re-described in the code without regenerating the page fails here."""
import subprocess
import sys
from pathlib import Path

from orchestrator.config import Config
from orchestrator.config_reference import reference

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python -m orchestrator.config --reference > docs/config.md"


def _keys(model, prefix=""):
    from orchestrator.config_reference import _section_of
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        nested = _section_of(field.annotation)
        yield from (_keys(nested, key) if nested is not None else [key])


def test_the_committed_page_is_what_the_code_generates():
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == reference(Config), f"docs/config.md is stale: run {REGENERATE}"


def test_every_leaf_key_has_a_row_with_its_default_and_bounds():
    text = reference(Config)
    keys = list(_keys(Config))
    assert len(keys) > 150 and "actor.lora.lr_scale" in keys
    for key in keys:
        assert f"| `{key}` |" in text, key
    row = next(line for line in text.splitlines() if line.startswith("| `actor.lora.lr_scale` |"))
    assert row.split(" | ")[1:4] == ["float", "`10.0`", "> 0, <= 10000"], row
    row = next(line for line in text.splitlines() if line.startswith("| `actor.lora.rank` |"))
    assert "**required**" in row


def test_the_module_prints_it_and_refuses_other_arguments():
    out = subprocess.run([sys.executable, "-m", "orchestrator.config", "--reference"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == reference(Config)
    bad = subprocess.run([sys.executable, "-m", "orchestrator.config"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--reference" in bad.stderr and bad.stderr.count("\n") == 1
