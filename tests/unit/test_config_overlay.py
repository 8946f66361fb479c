"""Config overlays: a file's top-level `defaults: FILE` names the config it is laid over (mappings
merged at any depth, anything else replaced, later wins), as strictly as one file: unknown keys
still name the nearest valid key, duplicates are refused, and a bad base is one clear error. The
recipe presets (configs/recipes/) are such overlays on the default job."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.config import ConfigError, load_config, merge_overlay

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs" / "recipes").glob("*.yaml"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _diff(a: dict, b: dict, prefix: str = "") -> dict:
    """Dotted keys whose values differ between two config dumps."""
    out = {}
    for key in a.keys() | b.keys():
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out.update(_diff(x, y, f"{prefix}{key}."))
        elif x != y:
            out[f"{prefix}{key}"] = y
    return out


def test_merge_is_deep_for_mappings_and_replaces_everything_else():
    base = {"a": {"b": 1, "c": [1, 2], "d": {"e": 1}}, "f": 2}
    over = {"a": {"c": [3], "d": {"g": 2}}, "f": None}
    assert merge_overlay(base, over) == {"a": {"b": 1, "c": [3], "d": {"e": 1, "g": 2}}, "f": None}
    assert base == {"a": {"b": 1, "c": [1, 2], "d": {"e": 1}}, "f": 2}      # inputs untouched


def test_a_chain_of_overlays_later_wins_and_overrides_win_last(tmp_path):
    _write(tmp_path / "base.yaml", "run: {total_steps: 7, seed: 3}\nrollout: {group_size: 4}\n")
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub" / "mid.yaml", "defaults: ../base.yaml\nrun: {total_steps: 9}\n")
    top = _write(tmp_path / "top.yaml", "defaults: sub/mid.yaml\nrollout: {group_size: 2}\n")
    cfg = load_config(top, ["run.seed=5"])
    assert (cfg.run.total_steps, cfg.run.seed, cfg.rollout.group_size) == (9, 5, 2)
    assert "defaults" not in cfg.model_dump()            # the resolved config holds no base key


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_each_recipe_is_the_default_job_plus_its_own_keys(recipe):
    own = yaml.safe_load(recipe.read_text())
    assert own.pop("defaults") == "../default.yaml"
    flat = _flatten(own)
    cfg = load_config(recipe)
    default = load_config().model_dump()
    changed = _diff(default, cfg.model_dump())
    assert changed.pop("algo.loss_horizon", None) in (None, cfg.rollout.max_new_tokens)  # derived
    assert changed == {k: v for k, v in flat.items() if _get(default, k) != v}
    assert cfg.run.dir == f"runs/{recipe.stem}"           # its runs never resume the default's


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        out.update(_flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


def test_recipes_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config("configs/recipes/dapo.yaml").actor.eps_clip_higher == 0.28


@pytest.mark.parametrize("text,match", [
    ("defaults: base.yaml\nalgo: {advantag: rloo}\n", r"unknown config key 'algo.advantag' \(did you mean 'algo.advantage'\?\)"),
    ("defaults: base.yaml\nrun: {seed: 1}\nrun: {seed: 2}\n", "duplicate key 'run'"),
    ("defaults: nope.yaml\n", "its base 'defaults: nope.yaml' is not a file"),
    ("defaults: [base.yaml]\n", "'defaults' names the base config this file overlays"),
    ("defaults: top.yaml\n", "makes a cycle"),
    ("defaults: base.yaml\nrun: {defaults: base.yaml}\n", "unknown config key 'run.defaults'"),
])
def test_bad_overlays_are_one_clear_error(tmp_path, text, match):
    _write(tmp_path / "base.yaml", "run: {total_steps: 7}\n")
    top = _write(tmp_path / "top.yaml", text)
    with pytest.raises(ConfigError, match=match):
        load_config(top)


def test_a_cycle_through_two_files_is_refused(tmp_path):
    _write(tmp_path / "a.yaml", "defaults: b.yaml\n")
    _write(tmp_path / "b.yaml", "defaults: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


def test_a_bad_base_file_is_named(tmp_path):
    _write(tmp_path / "base.yaml", "run: [1\n")
    with pytest.raises(ConfigError, match="base.yaml' is not valid YAML"):
        load_config(_write(tmp_path / "top.yaml", "defaults: base.yaml\n"))


def test_the_launcher_exits_2_on_an_unknown_key_in_an_overlay(tmp_path):
    top = _write(tmp_path / "top.yaml", "defaults: " + str(ROOT / "configs/recipes/dapo.yaml")
                 + "\nactor: {eps_clip_hihger: 0.3}\n")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config", str(top),
                           f"run.dir={tmp_path / 'r'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "unknown config key 'actor.eps_clip_hihger'" in proc.stderr
    assert "actor.eps_clip_higher" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()
