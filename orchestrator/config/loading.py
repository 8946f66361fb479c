"""Reading configs: strict YAML, overlays (`defaults:`), dotted overrides, one-line errors, and
`load_config`."""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.config.base import CONFIG_DIR, DEFAULT_CONFIG, ConfigError, MAX_CONFIG_BYTES
from orchestrator.config.root import Config


def _valid_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        ann = field.annotation
        args = [a for a in getattr(ann, "__args__", ()) if a is not type(None)]
        if len(args) == 1:                                  # Optional[Section]
            ann = args[0]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_valid_paths(ann, path + "."))
    return out


def _suggest(path: str) -> str:
    match = difflib.get_close_matches(path, _valid_paths(Config), n=1, cutoff=0.5)
    if not match:  # try the leaf name alone against leaf names
        leaf = path.rsplit(".", 1)[-1]
        cands = {p.rsplit(".", 1)[-1]: p for p in _valid_paths(Config)}
        near = difflib.get_close_matches(leaf, list(cands), n=1, cutoff=0.6)
        match = [cands[near[0]]] if near else []
    return f" (did you mean '{match[0]}'?)" if match else ""


class DuplicateKey(ValueError):
    """A YAML mapping repeats a key; the message names the dotted key and both lines."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys at any depth and reads YAML 1.2 floats (`1e-3`)."""

    def construct_document(self, node):
        self._no_duplicates(node, "", set())
        return super().construct_document(node)

    def _no_duplicates(self, node, prefix: str, seen_nodes: set) -> None:
        if id(node) in seen_nodes:                    # an alias: that node was checked already
            return
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, value_node in node.value:
                key = self._key(key_node)
                if key is not None:
                    path = f"{prefix}{key}"
                    if key in first:
                        raise DuplicateKey(f"duplicate key '{path}' at line "
                                           f"{key_node.start_mark.line + 1} (first at line {first[key]})")
                    first[key] = key_node.start_mark.line + 1
                    self._no_duplicates(value_node, path + ".", seen_nodes)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._no_duplicates(item, f"{prefix}{i}.", seen_nodes)

    def _key(self, node) -> Any:
        if not isinstance(node, yaml.ScalarNode) or node.tag == "tag:yaml.org,2002:merge":
            return None
        key = self.construct_object(node)
        try:
            hash(key)
        except TypeError:
            return None
        return key


_Loader.add_implicit_resolver(          # YAML 1.1 reads 1e-3 (no dot) as a string
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _parse_value(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return text


def apply_override(data: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override '{override}' is not of the form key=value")
    key, _, value = override.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override key '{key}' is empty or malformed")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override '{key}': '{part}' is not a section")
        node = child
    try:
        node[parts[-1]] = _parse_value(value)
    except DuplicateKey as exc:
        raise ConfigError(f"override '{key}': {exc}") from None


_EXPECTED = {"int_type": "expected an integer", "float_type": "expected a number",
             "string_type": "expected a string", "bool_type": "expected true or false",
             "list_type": "expected a list", "model_type": "expected a mapping (a section)",
             "finite_number": "must be a finite number"}


def _format_error(err: ValidationError) -> str:
    errors = err.errors()        # an unknown key first: a misspelt key also leaves its field missing
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        return f"unknown config key '{loc}'{_suggest(loc)}"
    msg = _EXPECTED.get(e["type"]) or e["msg"].removeprefix("Value error, ")
    if loc:
        got = e.get("input")
        kind = f" of type {type(got).__name__}" if e["type"] in _EXPECTED else ""
        shown = "" if isinstance(got, dict) else f" (got {got!r}{kind})"
        return f"invalid config field '{loc}': {msg}{shown}"
    return f"invalid config: {msg}"


BASE_KEY = "defaults"             # a file's base config (NeMo-RL's key; the file overlays it)
MAX_BASE_DEPTH = 8               # overlays of overlays: a recipe on a job on a base is three


def _config_path(path: Path) -> Path:
    if not path.is_absolute() and path.parts[:1] == ("configs",) and not path.exists():
        shipped = CONFIG_DIR.joinpath(*path.parts[1:])      # configs/X.yaml from any directory
        path = shipped if shipped.is_file() else path
    return path


def _read_yaml(path: Path) -> dict:
    """One config file's mapping, read strictly (size, UTF-8, YAML, duplicate keys, top-level map)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file '{path}' is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file '{path}' is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                          f"line {line})") from None
    try:
        data = yaml.load(text, Loader=_Loader) or {}
    except DuplicateKey as exc:
        raise ConfigError(f"config file '{path}': {exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise ConfigError(f"config file '{path}' is not valid YAML{line}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at top level")
    return data


def merge_overlay(base: dict, overlay: dict) -> dict:
    """`overlay` on `base`: mappings merge key by key, at any depth; any other value of the
    overlay (a scalar, a list, null) replaces the base's. Neither input is changed."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overlay(out[key], value)
        else:
            out[key] = value
    return out


def read_layers(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """The mapping of config file `path` laid over its base: a top-level `defaults: FILE` (relative
    to the file holding it) names the config this file overlays, itself read the same way (at most
    MAX_BASE_DEPTH files, no cycle); the result holds no `defaults` key."""
    data = _read_yaml(path)
    if BASE_KEY not in data:
        return data
    base = data.pop(BASE_KEY)
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"config file '{path}': '{BASE_KEY}' names the base config this file "
                          f"overlays: a file path (got {base!r})")
    base_path = Path(base) if Path(base).is_absolute() else path.parent / base
    seen = chain + (path,)
    if any(base_path.resolve() == p.resolve() for p in seen):
        raise ConfigError(f"config file '{path}': '{BASE_KEY}: {base}' makes a cycle "
                          f"({' -> '.join(str(p) for p in (*seen, base_path))})")
    if len(seen) >= MAX_BASE_DEPTH:
        raise ConfigError(f"config file '{path}': more than {MAX_BASE_DEPTH} files deep in "
                          f"'{BASE_KEY}' bases")
    if not base_path.is_file():
        raise ConfigError(f"config file '{path}': its base '{BASE_KEY}: {base}' is not a file "
                          f"({base_path})")
    return merge_overlay(read_layers(base_path, seen), data)


def load_config(path: Optional[str | Path] = None, overrides: list[str] = ()) -> Config:
    """Load YAML (default: configs/default.yaml) laid over its `defaults` base if it names one
    (`read_layers`), apply dotted overrides, validate."""
    path = _config_path(Path(path) if path is not None else DEFAULT_CONFIG)
    data = read_layers(path)
    keys = {ov.partition("=")[0].strip() for ov in overrides}
    if keys & {"task.dataset", "task.datasets"} and "task.name" not in keys \
            and isinstance(data.get("task"), dict):
        data["task"].pop("name", None)      # your data on the command line replaces the file's task
    for ov in overrides:
        apply_override(data, ov)
    notes = _eval_without_eval_set(data)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None
    cfg._notes.extend(notes)
    _say_final_eval(cfg)
    return cfg


def _say_final_eval(cfg: Config) -> None:
    """Eval rounds run every eval.every_steps and once more at run.total_steps (verl's test_freq and
    last step): said at start when the last step is not already one of them."""
    every, total = cfg.eval.every_steps, cfg.run.total_steps
    if every and total % every:
        when = "once, at" if every > total else "every eval.every_steps and a final round at"
        cfg.say(f"eval.every_steps={every} does not divide run.total_steps={total}: eval runs "
                f"{when} step {total}")


def _eval_without_eval_set(data: dict) -> list[str]:
    """Eval rounds asked for on task.dataset without task.eval_dataset: eval is off, with one note
    (the launcher prints it as a warning) instead of an error."""
    task, ev = data.get("task"), data.get("eval")
    if not (isinstance(task, dict) and isinstance(ev, dict)):
        return []
    mixture = task.get("datasets")
    if isinstance(mixture, list) and mixture:
        if any(isinstance(d, dict) and d.get("eval_path") is not None for d in mixture):
            return []
        field, missing, fix = "task.datasets", "eval_path on any source", "an eval_path on a source"
    elif task.get("dataset") is None or task.get("eval_dataset") is not None:
        return []
    else:
        field, missing, fix = "task.dataset", "task.eval_dataset", "task.eval_dataset"
    every = ev.get("every_steps")
    if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
        return []
    ev["every_steps"] = 0
    return [f"eval.every_steps={every} with {field} and no {missing}: eval is off "
            f"(set {fix} to evaluate)"]
