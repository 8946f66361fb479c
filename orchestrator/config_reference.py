"""The config reference: every key of the typed config (`orchestrator.config.Config`) with its type,
default, bounds and description, as markdown (issue #36).

Contract: `reference(config_cls) -> str` is docs/config.md's text for `config_cls`
(orchestrator.config.Config, passed in so this module imports no config: config's `__main__` calls
it), generated from the pydantic models alone (no file read): one section per top-level key in the
model's field order, a table row per leaf key (dotted name, type, default, bounds, description),
nested sections (actor.lora, inference.vllm, ...) as sections of their own after their parent's
rows, and a list of sections (`task.datasets`) as one more, `key[i]`, of its items' keys. `python -m
orchestrator.config --reference` prints it; tests/unit/test_config_reference.py fails when the
committed docs/config.md differs from it.
"""
from __future__ import annotations

import enum
import types
import typing
from typing import Any, Union

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

HEADER = """# Config reference

Every key of the run config, generated from the typed config by
`python -m orchestrator.config --reference > docs/config.md` (a test fails when this page and the
code disagree). Keys are set in a YAML file (`--config FILE`) or as `key=value` overrides on the
command line, e.g. `python -m orchestrator.launch actor.lr=5e-4 rollout.group_size=8`.
"""


def _section_of(annotation) -> type[BaseModel] | None:
    """The config section a field holds (itself or inside Optional), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None


def _item_section(annotation) -> type[BaseModel] | None:
    """The section each item of a list field holds (`task.datasets`), else None."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is list:
            return _section_of(typing.get_args(arg)[0])
    return None


def _type_text(annotation) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]
        text = " | ".join(_type_text(a) for a in parts)
        return f"{text} | null" if len(parts) < len(args) else text
    if origin in (list, tuple, dict, set):
        inner = ", ".join(_type_text(a) for a in args if a is not Ellipsis)
        return f"{origin.__name__}[{inner}]" if inner else origin.__name__
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "section"
        if issubclass(annotation, enum.Enum):
            return " | ".join(repr(m.value) for m in annotation)
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default_text(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(section defaults)"
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "len >="),
           ("max_length", "len <="))


def _bounds_text(field) -> str:
    out = []
    for meta in field.metadata:
        for attr, sign in _BOUNDS:
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(out)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rows(model: type[BaseModel], prefix: str, sections: list) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        nested = _section_of(field.annotation)
        if nested is not None:
            sections.append((key, nested, field))
            continue
        rows.append(f"| `{key}` | {_cell(_type_text(field.annotation))} | {_default_text(field)} "
                    f"| {_bounds_text(field)} | {_cell(field.description or '')} |")
        item = _item_section(field.annotation)
        if item is not None:                  # a list of sections: its items' keys, after it
            sections.append((f"{key}[i]", item, None))
    return rows


def _section(key: str, model: type[BaseModel], field=None) -> list[str]:
    lines = [f"## `{key}`", ""]
    intro = field.description if field is not None and field.description else model.__doc__
    if intro:
        lines += [" ".join(intro.split()), ""]
    if field is not None and _default_text(field) == "null":
        lines += ["Unset (null) by default; setting any of its keys turns it on.", ""]
    nested: list = []
    rows = _rows(model, key, nested)
    if rows:
        lines += ["| key | type | default | bounds | description |", "|---|---|---|---|---|",
                  *rows, ""]
    for sub_key, sub_model, sub_field in nested:
        lines += _section(sub_key, sub_model, sub_field)
    return lines


def reference(config_cls: type[BaseModel]) -> str:
    lines = [HEADER]
    for name, field in config_cls.model_fields.items():
        model = _section_of(field.annotation)
        if model is not None:
            lines += _section(name, model, field)
    return "\n".join(lines).rstrip() + "\n"
