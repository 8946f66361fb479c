"""Typed, validated run configuration: YAML file + dotted `key=value` overrides.

Contract: `load_config(path, overrides)` returns a fully validated `Config` or raises `ConfigError`
whose message is one line naming the offending field (unknown keys suggest the nearest valid key).
Nothing heavy is imported here; validation happens before any process or shm segment exists.
Key names under `rollout.*` and `actor.*` follow AReaL.

Overlays: a file whose top level holds `defaults: FILE` (NeMo-RL's key; the path relative to the
file) is laid over that base config, itself read the same way (`read_layers`: mappings merge at any
depth, any other value replaces the base's; at most 8 files, no cycle), then the overrides apply.
The recipe presets (configs/recipes/*.yaml) are overlays on configs/default.yaml. Each file is held
to the input rules below, and the merged result is validated as one config.

Input rules: the file must be UTF-8 YAML with no duplicate key at any depth (the error names the
dotted key and both lines); `1e-3` is a float (YAML 1.2) as well as `1.0e-3`. Values are typed
strictly, never coerced across bool/int/float/str: an int field takes only an int (not `true`, not
`2.0`), a float field an int or a float, a str field only a string, a bool field only true/false.
Floats must be finite (no .inf/.nan). Every count, size and timeout has an upper bound whose reason
is in its description. Device fields take CUDA indices ('0', or a YAML int 0). Checks that need the
machine (devices present, CPUs, free /dev/shm) live in `orchestrator.runtime.preflight`.

Layout (issue #36: a module per section, cross-section checks in one place): `base` (the config
directory, ConfigError, shared bounds, the strict section base), one module per section (`run`,
`inference`, `actor` (with `actor.lora`), `model`, `task`, `rollout` (with `eval`), `observe`
(`metrics`), `placement` (with `weights`), `algo`), `root` (`Config`: the whole run and every check
that spans sections), `loading` (YAML, overlays, overrides, errors, `load_config`). Every name is
importable from `orchestrator.config` as before; `python -m orchestrator.config --reference` prints
the config reference (docs/config.md).
"""
from orchestrator.config.base import (REPO_ROOT, CONFIG_DIR, DEFAULT_CONFIG, ConfigError, MAX_STEPS,
    MAX_TIMEOUT_S, MAX_THREADS, MAX_TOKENS, MAX_COUNT, MAX_CONFIG_BYTES, _Section, DeviceList)
from orchestrator.config.run import RunConfig
from orchestrator.config.inference import SimInferenceConfig, VllmConfig, InferenceConfig
from orchestrator.config.actor import (SimTrainerConfig, TINY_LINEAR, default_lora_alpha, LoraConfig,
    ActorConfig, EXACT_DIFF_LIMIT, ROUNDED_DIFF_LIMIT, logprob_diff_default, trainer_layout)
from orchestrator.config.model import ModelConfig
from orchestrator.config.task import TaskConfig
from orchestrator.config.rollout import RolloutConfig, EvalConfig
from orchestrator.config.observe import WandbConfig, MetricsConfig
from orchestrator.config.placement import WeightsConfig, PlacementConfig
from orchestrator.config.algo import AlgoConfig
from orchestrator.config.root import Config, env_spec, deterministic_refusal
from orchestrator.config.loading import (DuplicateKey, apply_override, BASE_KEY, MAX_BASE_DEPTH,
    merge_overlay, read_layers, load_config)

__all__ = ['REPO_ROOT', 'CONFIG_DIR', 'DEFAULT_CONFIG', 'ConfigError', 'MAX_STEPS',
           'MAX_TIMEOUT_S', 'MAX_THREADS', 'MAX_TOKENS', 'MAX_COUNT', 'MAX_CONFIG_BYTES',
           '_Section', 'DeviceList', 'RunConfig', 'SimInferenceConfig', 'VllmConfig',
           'InferenceConfig', 'SimTrainerConfig', 'TINY_LINEAR', 'default_lora_alpha',
           'LoraConfig', 'ActorConfig', 'EXACT_DIFF_LIMIT', 'ROUNDED_DIFF_LIMIT',
           'logprob_diff_default', 'trainer_layout', 'ModelConfig', 'TaskConfig', 'RolloutConfig',
           'EvalConfig', 'WandbConfig', 'MetricsConfig', 'WeightsConfig', 'PlacementConfig',
           'AlgoConfig', 'Config', 'env_spec', 'deterministic_refusal', 'DuplicateKey',
           'apply_override', 'BASE_KEY', 'MAX_BASE_DEPTH', 'merge_overlay', 'read_layers',
           'load_config']
