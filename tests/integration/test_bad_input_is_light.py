"""Bad input is refused before anything heavy starts, as the launcher's contract says: a launch that
exits 2 on a bad config, a missing or malformed dataset or a bad reward never imports torch (the
built-in tokenizer needs none), and a dataset path that does not exist or has an unknown format is
refused before `datasets` is imported. Each case runs `orchestrator.launch.main` in a fresh
interpreter and reports the heavy modules it left in `sys.modules`."""
import json
import os
import subprocess
import sys

import pytest

from tests.integration.lifecycle import ROOT

pytest.importorskip("datasets")

PROBE = """
import json, sys
from orchestrator.launch import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "heavy": sorted(m for m in ("torch", "datasets", "pandas")
                                                if m in sys.modules)}))
"""
BASE = ["--config", str(ROOT / "configs/default.yaml"), "eval.every_steps=0", "run.progress=false"]


def _probe(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PROBE, *BASE, f"run.dir={tmp_path / 'run'}", *args],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.strip(), out.stderr[-2000:]
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["code"] == 2 and out.stderr.startswith("error: "), out.stderr[-2000:]
    assert not (tmp_path / "run").exists()
    return set(rec["heavy"]), out.stderr


def test_a_bad_config_key_imports_nothing_heavy(tmp_path):
    heavy, err = _probe(tmp_path, "actor.lrr=1")
    assert heavy == set() and "actor.lr" in err


@pytest.mark.parametrize("name", ["nope.jsonl", "d.txt"])
def test_a_dataset_missing_or_of_unknown_format_is_refused_before_datasets_is_imported(tmp_path, name):
    if name == "d.txt":
        (tmp_path / name).write_text("x")
    heavy, err = _probe(tmp_path, "task.name=dataset", f"task.dataset={tmp_path / name}",
                        "task.reward=exact_match")
    assert heavy == set() and "task.dataset" in err


def test_a_dataset_without_the_prompt_column_is_refused_without_torch(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"question": "1>", "answer": "1"}) + "\n")
    heavy, err = _probe(tmp_path, "task.name=dataset", f"task.dataset={tmp_path / 'd.jsonl'}",
                        "task.reward=exact_match")
    assert "torch" not in heavy and "no column 'prompt'" in err
