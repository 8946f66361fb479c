"""LoRA adapters (peft) on the trainer's model: wrapping, the merged weights inference loads, and
the adapter files checkpoints and exports hold.

Contract (issue #25; `actor.lora` of orchestrator.config):
- `wrap(module, lora_cfg, seed) -> PeftModel`: peft's LoRA injected into `module` in place (its
  target layers become peft LoRA layers: parameters `<layer>.base_layer.weight`,
  `<layer>.lora_A.default.weight`, `<layer>.lora_B.default.weight`; `peft_model.base_model.model is
  module`, so the trainer shares and trains `module` as it does a plain model). Only the adapters
  require grad; their init is deterministic in `seed` (A kaiming-uniform, B zero: version 0's merged
  weights are the base's), so every trainer rank builds the same adapters.
- `MergedSource(module, layout, gather)`: a mapping from the flat layout's names (the base model's,
  what inference loads) to tensors: a LoRA layer's weight is W + scaling x B @ A (transposed for
  fan_in_fan_out layers; computed in float32, cast to W's dtype), every other name the parameter
  itself. `gather=False`: under FSDP2 each rank's own dim-0 rows (its rows of W and B, A gathered:
  a collective, so every rank reads every LoRA slot, in layout order); `gather=True`: full tensors
  (every sharded tensor gathered; the CUDA IPC path, where rank 0 writes the whole layout).
- Adapter files (a peft adapter directory: `adapter_config.json` + `adapter_model.safetensors`,
  what `peft.PeftModel.from_pretrained(base, dir)` loads): `adapter_tensors(module, full)` -> the
  adapter parameters by peft's saved names (a CPU copy); `write_adapter(dir, config, tensors)`;
  `read_adapter(dir)`; `load_adapter(module, tensors)` copies them in (names checked both ways).
- Adapter-only publish (`inference.vllm.lora`): the weight buffer carries the adapters alone, in a
  flat layout of their own (`adapter_layout(peft_model)`: peft's saved names, i.e.
  `adapter_tensors`' keys, full shapes, peft's order; `adapter_spec(cfg)`: that layout and the peft
  config from the run config's model on the meta device, for inference and the buffer's size).
  `write_flat_adapter(tensors, layout, out)` writes `adapter_tensors` into a flat buffer (bytes-like
  or a uint8 tensor; names checked both ways; `gathered_adapters(peft_model)`: them on rank 0 of
  sharded ranks), `adapter_from_flat(layout, flat)` views them back
  (no copy) for `write_adapter`.
- `export_merged(trainer_dir, config, out)`: a LoRA checkpoint's merged HF model (what
  `python -m orchestrator.export` writes for a LoRA run), its base checked against the saved hash.
"""
from __future__ import annotations

import copy
import json
import os
import warnings
from collections.abc import Mapping
from typing import Iterator

import torch

ADAPTER = "default"                          # peft's adapter name
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
SAVED_PREFIX = "base_model.model."           # peft's saved names: a PeftModel's, adapter name dropped


def hidden_size(module) -> int:
    """The model's width, what actor.lora.alpha's default follows."""
    return int(module.config.hidden_size)


def peft_config(lora_cfg, hidden: int, base_path=None):
    from peft import LoraConfig

    return LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.resolved_alpha(hidden),
                      lora_dropout=lora_cfg.dropout, bias="none",
                      target_modules=lora_cfg.target_modules, task_type="CAUSAL_LM",
                      base_model_name_or_path=base_path)


def wrap(module, lora_cfg, seed: int, base_path=None):
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)                 # deterministic adapters; the caller's RNG untouched
        warnings.simplefilter("ignore", FutureWarning)   # transformers' deprecations peft calls
        peft_model = get_peft_model(module, peft_config(lora_cfg, hidden_size(module), base_path))
    assert peft_model.base_model.model is module
    return peft_model


def lora_layers(module) -> dict[str, object]:
    """The peft LoRA layers of `module` by module name."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class MergedSource(Mapping):
    """Layout name -> tensor to publish (see the module contract). Read lazily: one merged
    tensor at a time."""

    def __init__(self, module, layout, gather: bool):
        self.params = dict(module.named_parameters())
        self.layers = lora_layers(module)
        self.names = [s.name for s in layout.slots]
        self.gather = gather

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __getitem__(self, name: str) -> torch.Tensor:
        prefix, _, leaf = name.rpartition(".")
        layer = self.layers.get(prefix)
        if layer is None:
            p = self.params[name].detach()
            return _full(p) if self.gather else p
        base = getattr(layer.base_layer, leaf).detach()
        if leaf != "weight":
            return _full(base) if self.gather else base
        a = _full(layer.lora_A[ADAPTER].weight.detach())           # [r, in]: small, gathered
        b = layer.lora_B[ADAPTER].weight.detach()                   # [out, r]
        scale = layer.scaling[ADAPTER]
        if layer.fan_in_fan_out:           # W is [in, out]: its rows are A's columns; take them whole
            w = _full(base)
            merged = w + ((_full(b).float() @ a.float()).T * scale).to(w.dtype)
            if self.gather or not hasattr(base, "to_local"):
                return merged
            rows = -(-w.shape[0] // base.device_mesh.size())
            lo = rows * base.device_mesh.get_local_rank()
            return merged[lo:lo + _local(base).shape[0]]
        if self.gather:
            w, b = _full(base), _full(b)
        else:
            w, b = _local(base), _local(b)    # the same dim-0 rows of W and B (both out-major)
        return w + ((b.float() @ a.float()) * scale).to(w.dtype)


def _by_saved_name(peft_model, value) -> dict:
    """`value(p)` of every adapter parameter, by peft's saved name (what checkpoints, exports and
    the adapter-only layout all use)."""
    from peft import get_peft_model_state_dict

    module = peft_model.base_model.model
    state = {SAVED_PREFIX + n: value(p) for n, p in module.named_parameters() if p.requires_grad}
    return get_peft_model_state_dict(peft_model, state_dict=state, adapter_name=ADAPTER,
                                     save_embedding_layers=False)


def adapter_tensors(peft_model, full: bool = True) -> dict[str, torch.Tensor]:
    """The adapter parameters by peft's saved names, copied to CPU; `full`: sharded ones
    gathered (a collective)."""
    return _by_saved_name(peft_model, lambda p: (_full(p.detach()) if full else _local(p.detach()))
                          .to("cpu", copy=True))


def gathered_adapters(peft_model) -> dict[str, torch.Tensor] | None:
    """`adapter_tensors` (full) on rank 0, None on other ranks of a sharded model; every rank
    calls it. Under FSDP2 on CPU (each adapter a DTensor sharded on dim 0 of a 1-D mesh) each
    rank's rows go to rank 0 in one `gather_object` and are concatenated in rank order: one
    collective, not one per adapter; otherwise each adapter's `full_tensor` (on GPU, NCCL's
    all-gathers are fast)."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard

    module = peft_model.base_model.model
    sharded = [p for p in module.parameters() if p.requires_grad and hasattr(p, "device_mesh")]
    if not sharded:
        return adapter_tensors(peft_model, full=False)
    mesh = sharded[0].device_mesh
    if mesh.device_type != "cpu" or mesh.ndim != 1 or any(
            p.device_mesh != mesh or tuple(p.placements) != (Shard(0),) for p in sharded):
        full = adapter_tensors(peft_model, full=True)
        return full if dist.get_rank() == 0 else None
    local = adapter_tensors(peft_model, full=False)
    parts = [None] * mesh.size() if dist.get_rank() == 0 else None
    dist.gather_object(local, parts, dst=0, group=mesh.get_group())
    if parts is None:
        return None
    return {name: torch.cat([part[name] for part in parts]) for name in local}


def write_adapter(directory: str, config, tensors: dict[str, torch.Tensor]) -> None:
    """A peft adapter directory: `config` (a peft LoraConfig) as adapter_config.json and `tensors`
    (adapter_tensors) as adapter_model.safetensors."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    config.save_pretrained(directory)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(directory, WEIGHTS_FILE), metadata={"format": "pt"})


def read_adapter(directory: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(adapter_config.json as a dict, tensors) of a peft adapter directory."""
    from safetensors.torch import load_file

    with open(os.path.join(directory, CONFIG_FILE), "rb") as f:
        config = json.loads(f.read())
    return config, load_file(os.path.join(directory, WEIGHTS_FILE))


def load_adapter(peft_model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy saved adapter tensors (one rank: plain parameters) into the model's adapters; a
    missing or unexpected name is a ValueError naming a few."""
    from peft import set_peft_model_state_dict

    want = set(adapter_tensors(peft_model, full=False))
    if set(tensors) != want:
        extra, missing = sorted(set(tensors) - want), sorted(want - set(tensors))
        raise ValueError(f"the adapter does not match the model's LoRA layers (unexpected "
                         f"{extra[:3]}, missing {missing[:3]})")
    with torch.no_grad():
        set_peft_model_state_dict(peft_model, tensors, adapter_name=ADAPTER)


def adapter_layout(peft_model):
    """The flat layout of the adapter-only publish: `adapter_tensors`' names (peft's saved ones) and
    full shapes (a sharded parameter's global shape), in peft's order."""
    from orchestrator.backends.model import layout_of

    return layout_of(_by_saved_name(peft_model, lambda p: p).items())


def adapter_spec(cfg):
    """(peft LoraConfig, adapter layout) of a run config's adapters (`actor.lora` on `model`), from
    the model on the meta device: no weights read, no parameter memory. The config is the one the
    trainer's adapters have (its target modules resolved to the layers peft found)."""
    from orchestrator.backends.model import meta_model

    peft_model = wrap(meta_model(cfg), cfg.actor.lora, 0, cfg.model.path)
    return copy.deepcopy(peft_model.peft_config[ADAPTER]), adapter_layout(peft_model)


def write_flat_adapter(tensors: dict[str, torch.Tensor], layout, out) -> None:
    """`tensors` (`adapter_tensors`) into `out`, a flat buffer of `layout` (writable bytes-like, or
    a uint8 tensor on any device); their names must be exactly the layout's."""
    from orchestrator.backends.model import slot_views

    names = {s.name for s in layout.slots}
    if set(tensors) != names:
        extra, missing = sorted(set(tensors) - names), sorted(names - set(tensors))
        raise ValueError(f"the adapters do not match the published layout (unexpected {extra[:3]}, "
                         f"missing {missing[:3]})")
    with torch.no_grad():
        for s, view in slot_views(layout, out):
            view.copy_(tensors[s.name].reshape(s.shape))


def adapter_from_flat(layout, flat) -> dict[str, torch.Tensor]:
    """The adapter tensors of a flat buffer of `layout`, by name: views into it, no copy."""
    from orchestrator.backends.model import slot_views

    return {s.name: t for s, t in slot_views(layout, flat)}


def signature(lora_cfg, module) -> dict:
    """What a checkpoint's adapters on `module` must match to be resumed: rank, alpha (resolved),
    target modules."""
    targets = lora_cfg.target_modules
    return {"rank": lora_cfg.rank, "alpha": lora_cfg.resolved_alpha(hidden_size(module)),
            "target_modules": targets if isinstance(targets, str) else sorted(targets)}


def export_merged(trainer_dir: str, config: dict, out: str) -> None:
    """The merged HF model of a LoRA checkpoint's `trainer_dir`: the run's base model (`config`,
    the run's resolved config: model.path, or the built-in model of run.seed) with the checkpoint's
    adapter merged by peft (`PeftModel.from_pretrained(...).merge_and_unload()`), written by
    `export_hf` to `out`. The base is checked against the hash the checkpoint holds first: another
    base is a ValueError naming both."""
    from peft import PeftModel

    from orchestrator.backends.model import build_model, export_hf
    from orchestrator.backends.trainer_files import OPTIM_FILE, RANK_STATE, weights_hash
    from orchestrator.config import ModelConfig
    from orchestrator.data.tokens import load_tokens

    name = OPTIM_FILE if os.path.exists(os.path.join(trainer_dir, OPTIM_FILE)) else RANK_STATE
    saved = torch.load(os.path.join(trainer_dir, name), map_location="cpu", weights_only=True)["lora"]
    model_cfg = ModelConfig.model_validate(config["model"])
    tokens = load_tokens(model_cfg.path)
    base = build_model(model_cfg, len(tokens.tokenizer), int(config["run"]["seed"]))
    digest = weights_hash(base)
    if digest != saved["hash"]:
        raise ValueError(f"the adapters of {trainer_dir} were trained on another base (weights hash "
                         f"{saved['hash'][:16]}) than {model_cfg.path or 'the built-in model'} is "
                         f"now (weights hash {digest[:16]})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        merged = PeftModel.from_pretrained(base, os.path.join(trainer_dir, "adapter")).merge_and_unload()
    export_hf(merged, tokens.tokenizer, out)
