"""Tiny causal LM and the flat weight layout shared by trainer and inference.

Contract (the built-in tokenizer is `orchestrator.data.tokens.build_tokenizer`):
- `build_model(model_cfg, vocab_size, seed)`: a `LlamaForCausalLM` built from config (deterministic
  in `seed`: the trainer and every inference worker build identical version-0 weights), or
  `from_pretrained(model_cfg.path)` from a local directory only. Returned in eval mode, dtype
  `model_cfg.dtype`, on CPU.
- Flat weights: `flat_layout(model)` fixes one order (named_parameters, shared tensors once), one
  dtype-preserving slot per parameter at a 64-byte aligned offset; `write_flat(model, out)` copies
  every parameter into `out`, `load_flat(model, flat)` copies them back. Both view the buffer in place
  with `torch.frombuffer` (no intermediate copy). A buffer of the wrong size raises ValueError.
  `bind_flat(model)` moves a CPU model's parameters into one flat buffer of that layout and returns
  it: bytes read into it are the weights (an inference reload is one copy).
- `export_hf(model, tokenizer, out, state_dict=None)`: `save_pretrained` of both (safetensors;
  tied embeddings stored once, also from a copied or gathered `state_dict`: `tied_aliases`),
  without progress bars: a directory transformers and vLLM load as is.
- `weight_nbytes_for(cfg)`: the flat size for a run config, from a model built on the meta device
  (`meta_model(cfg)`: no parameter memory, no weights read). `layout_of(named)`: the same layout
  over any (name, tensor) pairs (LoRA's adapter-only publish has a layout of its own).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Union

import torch

from orchestrator.data.tokens import BOS, EOS, PAD, VOCAB, build_tokenizer, quiet_hf

_ALIGN = 64
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------------- model

def resolve_device(device: Union[str, torch.device, None]) -> torch.device:
    """'cpu' -> cpu; 'cuda' / 'cuda:N' as given; a bare index 'N' -> 'cuda:N'."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, torch.device):
        return device
    text = str(device).strip()
    if text.isdigit():
        return torch.device(f"cuda:{text}")
    return torch.device(text)


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def _tiny_config(model_cfg, vocab_size: int):
    from transformers import LlamaConfig

    if model_cfg.hidden_size % model_cfg.num_heads:
        raise ValueError(f"model.hidden_size {model_cfg.hidden_size} is not divisible by "
                         f"model.num_heads {model_cfg.num_heads}")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=2 * model_cfg.hidden_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_heads,
        max_position_embeddings=model_cfg.max_seq_len,
        tie_word_embeddings=False,
        pad_token_id=VOCAB.index(PAD), bos_token_id=VOCAB.index(BOS), eos_token_id=VOCAB.index(EOS),
        initializer_range=0.02,
        use_cache=False,
        attn_implementation="sdpa",
    )


def build_model(model_cfg, vocab_size: int, seed: int):
    """Causal LM: tiny Llama from `model_cfg` (seeded init) or a local HF directory."""
    from transformers import LlamaForCausalLM

    dtype = _DTYPES[model_cfg.dtype]
    if model_cfg.path is not None:
        from transformers import AutoModelForCausalLM
        with quiet_hf():
            model = AutoModelForCausalLM.from_pretrained(model_cfg.path, local_files_only=True,
                                                         dtype=dtype)
        return model.eval()
    config = _tiny_config(model_cfg, vocab_size)
    # fork the global RNG so building a model never disturbs the caller's random state
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def tied_aliases(model) -> set[str]:
    """Second names of shared parameters (a tied LM head: `lm_head.weight` when it is the
    embedding): `state_dict()` lists them, `named_parameters()` and the flat layout do not."""
    first = {n for n, _ in model.named_parameters()}
    return {n for n, _ in model.named_parameters(remove_duplicate=False)} - first


def export_hf(model, tokenizer, out: str, state_dict: Optional[dict] = None) -> None:
    """An HF model directory: config.json, generation_config.json, safetensors weights (tied
    embeddings stored once, as transformers does) and the tokenizer files (chat template included).
    `state_dict`: the full weights to write instead of the model's own (a copy, or a sharded
    model's gathered weights); the model's tied aliases are dropped from it, since a copied state
    dict no longer shares the tied tensor and transformers would store it twice."""
    if state_dict is not None:
        drop = tied_aliases(model)
        state_dict = {k: v for k, v in state_dict.items() if k not in drop}
    with quiet_hf():
        model.save_pretrained(out, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(out)


def meta_model(cfg):
    """The run `Config`'s model on the meta device: names, shapes and dtypes, no parameter memory."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

    mc = cfg.model
    with torch.device("meta"):
        if mc.path is not None:
            config = AutoConfig.from_pretrained(mc.path, local_files_only=True)
            return AutoModelForCausalLM.from_config(config, dtype=_DTYPES[mc.dtype])
        vocab = len(build_tokenizer(cfg.task.name))
        return LlamaForCausalLM(_tiny_config(mc, vocab)).to(_DTYPES[mc.dtype])


def weight_nbytes_for(cfg) -> int:
    """Flat weight size for a run `Config` without materialising any parameter."""
    return flat_layout(meta_model(cfg)).nbytes


# ---------------------------------------------------------------------------------- flat weights

@dataclass(frozen=True)
class Slot:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class FlatLayout:
    slots: tuple[Slot, ...]
    nbytes: int


def flat_layout(model) -> FlatLayout:
    """Deterministic layout of every parameter (named_parameters order, shared tensors once)."""
    return layout_of(model.named_parameters())


def layout_of(named) -> FlatLayout:
    """The flat layout of (name, tensor) pairs, in the order given (LoRA's adapters: their own)."""
    slots, offset = [], 0
    for name, p in named:
        nbytes = p.numel() * p.element_size()
        slots.append(Slot(name, p.dtype, tuple(p.shape), offset, nbytes))
        offset += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return FlatLayout(tuple(slots), offset)


def flat_views(buf, nbytes: int, writable: bool = True):
    """`view(offset, dtype, numel)`: a tensor over `numel` elements of `buf` at `offset` (the flat
    layout's buffer of `nbytes` bytes, viewed in place, no copy). `writable=False` accepts a
    read-only buffer, whose views are only ever read."""
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    if writable and mv.readonly:
        raise ValueError("flat weights need a writable buffer")
    if mv.nbytes != nbytes:
        raise ValueError(f"flat weight buffer has {mv.nbytes} bytes, layout needs {nbytes}")

    def view(offset: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(mv, dtype=dtype, count=numel, offset=offset)
    return view


def slot_views(layout: FlatLayout, buf) -> list[tuple[Slot, torch.Tensor]]:
    """Every parameter slot of `layout` as a tensor view into `buf`: a bytes-like buffer (read-only
    accepted) or a uint8 tensor on any device (the CUDA IPC path)."""
    if isinstance(buf, torch.Tensor):
        return list(_tensor_views(layout, buf))
    view = flat_views(buf, layout.nbytes, writable=False)
    return [(s, view(s.offset, s.dtype, s.numel).view(s.shape) if s.numel
             else torch.empty(s.shape, dtype=s.dtype)) for s in layout.slots]


def write_flat(model, out: memoryview, layout: Optional[FlatLayout] = None) -> None:
    """Copy every parameter into `out` (writable, len == flat_layout(model).nbytes)."""
    layout = layout or flat_layout(model)
    view = flat_views(out, layout.nbytes)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for s in layout.slots:
            if s.numel:
                view(s.offset, s.dtype, s.numel).copy_(params[s.name].detach().reshape(-1))


def load_flat(model, flat: memoryview, layout: Optional[FlatLayout] = None) -> None:
    """Copy parameters out of `flat` (same layout) into the model, in place."""
    layout = layout or flat_layout(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for s, view in slot_views(layout, flat):
            params[s.name].copy_(view)


def bind_flat(model, layout: Optional[FlatLayout] = None) -> memoryview:
    """Move every parameter of a CPU model into one flat buffer in `layout` (the trainer's), in
    place: each parameter becomes a view of its slot (tied parameters share theirs). Returns the
    buffer as a writable memoryview: bytes written into it are the model's weights, no second copy."""
    layout = layout or flat_layout(model)
    flat = torch.zeros(layout.nbytes, dtype=torch.uint8)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for s, view in _tensor_views(layout, flat):
            p = params[s.name]
            if p.device.type != "cpu":
                raise ValueError(f"bind_flat needs a CPU model; {s.name} is on {p.device}")
            view.copy_(p)
            p.data = view
    return memoryview(flat.numpy())


def _tensor_views(layout: FlatLayout, buf: torch.Tensor):
    if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() != layout.nbytes:
        raise ValueError(f"flat weight tensor must be uint8[{layout.nbytes}], got "
                         f"{buf.dtype}[{buf.numel()}]")
    for s in layout.slots:
        yield s, buf[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape)


def write_flat_tensor(model, buf: Optional[torch.Tensor], layout: Optional[FlatLayout] = None,
                      source=None) -> None:
    """Like write_flat, into a uint8 tensor on any device (the CUDA IPC path). Sharded parameters
    (DTensors) are gathered first, a collective every rank joins: ranks other than the writer
    pass `buf=None`. `source`: a mapping layout name -> tensor written instead of the model's
    parameter (LoRA's merged weights), read once per slot in layout order on every rank."""
    layout = layout or flat_layout(model)
    params = source if source is not None else dict(model.named_parameters())
    views = dict(_tensor_views(layout, buf)) if buf is not None else {}
    with torch.no_grad():
        for s in layout.slots:
            p = params[s.name].detach()
            if hasattr(p, "full_tensor"):
                p = p.full_tensor()
            if s in views:
                views[s].copy_(p)


def load_flat_tensor(model, buf: torch.Tensor, layout: Optional[FlatLayout] = None) -> None:
    """Like load_flat, from a uint8 tensor on any device (the CUDA IPC path)."""
    layout = layout or flat_layout(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for s, view in _tensor_views(layout, buf):
            params[s.name].copy_(view)

