"""Shared pieces of every config section: the config directory, ConfigError, the upper bounds
shared by several fields, the strict section base class and device-index fields."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict


REPO_ROOT = Path(__file__).resolve().parents[2]
# the configs: an installed copy carries them as orchestrator/configs (setup.py), a checkout at its root
_PACKAGED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONFIG_DIR = _PACKAGED_CONFIGS if _PACKAGED_CONFIGS.is_dir() else REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"


class ConfigError(ValueError):
    """Bad configuration; the message is a single line naming the field."""


# upper bounds shared by several fields (the reason is in each field's description)
MAX_STEPS = 99_999_999          # batch files are named step_%08d: more digits break their order
MAX_TIMEOUT_S = 86_400.0        # a day: longer than any startup, sync or latency worth waiting for
MAX_THREADS = 1024              # more cores than any single node has
MAX_TOKENS = 1 << 20            # 1M tokens per prompt or completion; beyond any model's context
MAX_COUNT = 1 << 20             # queued/in-flight items held in the supervisor's memory
MAX_CONFIG_BYTES = 1 << 20      # a config file is a page of YAML, not data
_DEVICE = re.compile(r"(0|[1-9][0-9]{0,5})\Z")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True,
                              allow_inf_nan=False, defer_build=True)


def _device_text(v: Any) -> Any:
    """A device index written as a YAML int (0) is the string '0'; bools stay (and are refused)."""
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else v


def _check_device(v: str) -> str:
    if not _DEVICE.match(v):
        raise ValueError(f"{v!r} is not a CUDA device index (a non-negative integer such as '0')")
    return v


def _devices_as_text(v: Any) -> Any:
    return [_device_text(d) for d in v] if isinstance(v, list) else v


def _devices_are_indices(v: list[str]) -> list[str]:
    for d in v:
        _check_device(d)
    return v


# a list of CUDA device indices, written as text or YAML ints (inference.devices, actor.devices)
DeviceList = Annotated[list[str], BeforeValidator(_devices_as_text), AfterValidator(_devices_are_indices)]
