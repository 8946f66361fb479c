"""The trainer checkpoint's file names and the weights hash, shared by the torch trainer (which
writes and reads them) and the LoRA export (which reads a checkpoint's base hash): a room below
both, so neither imports the other.

Contract: a one-rank checkpoint's `trainer/` holds `HF_DIR` (the model as an HF directory) or,
for LoRA, `ADAPTER_DIR` (a peft adapter directory), and `OPTIM_FILE` (optimizer state, step count,
RNG, the LoRA base's hash); older checkpoints `MODEL_FILE`. Ranks write `RANKS_FILE` (world size
and sharding) and `RANK_STATE` beside the DCP shards. `weights_hash(module)`: blake2b (hex) of a
model's state dict as held: names, dtypes, shapes and bytes, in name order (a tied alias hashes its
tensor again).
"""
from __future__ import annotations

import hashlib

import torch

MODEL_FILE, OPTIM_FILE, HF_DIR, ADAPTER_DIR = "model.safetensors", "optimizer.pt", "hf", "adapter"
RANKS_FILE, RANK_STATE = "ranks.json", "trainer_state.pt"


def weights_hash(module) -> str:
    """blake2b (hex) of a model's state dict as held: names, dtypes, shapes and bytes, in name
    order (a tied alias hashes its tensor again)."""
    h = hashlib.blake2b(digest_size=32)
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
