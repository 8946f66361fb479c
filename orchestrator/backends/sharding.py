"""Trainer ranks: the process group, how the model is shared, and what each rank writes or saves.

Contract:
- `RankGroup.from_env(actor_cfg, device)`: joins the group the supervisor set up in the rank's
  environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; no torchrun): NCCL on a GPU, gloo on CPU,
  every collective bounded by `actor.collective_timeout_s`. A second, gloo group carries the
  commands rank 0 broadcasts (`command`/`receive`: a kind and a payload of bytes), so control never
  waits on the accelerator; a third, gloo too, carries the collectives of checkpoint writes
  (`saves`), which run in a writer thread while training collectives go on. `reduce(values, op)`
  sums or maxes a few floats across ranks.
- `share(model, actor_cfg, group)`: `fsdp` applies FSDP2 (`fully_shard` on every decoder layer,
  then the root; `MixedPrecisionPolicy(param_dtype, reduce_dtype)`), parameters and optimizer state
  sharded on dim 0; `ddp` wraps in DistributedDataParallel; `none` returns the model. FSDP2 runs on
  CPU with gloo in this torch (2.13), so the CPU tests run the same sharded path as a GPU.
  `actor.activation_checkpointing` uses transformers' gradient checkpointing (non-reentrant).
- `share_frozen(model, actor_cfg, group)`: a forward-only model (the KL reference) shared like the
  actor: `fsdp` applies FSDP2 the same way, in the model's own dtype (its parameters never take a
  gradient; reshard it after a forward); `ddp` and `none` keep one replica per rank (nothing to
  synchronise).
- `shard_writes(model, layout, rank, world, strategy)`: the (slot, byte offset, tensor) pieces this
  rank writes into the flat weight layout (orchestrator.backends.model): under fsdp each rank its own dim-0
  rows of every parameter (FSDP2 chunks dim 0 in ceil(n / world) rows), under ddp or none whole
  parameters dealt to ranks by bytes. Together the ranks write every byte exactly once, and no
  weight passes through rank 0 (`trainer_worker.publish_together` puts them in the weight buffer).
  `source` replaces the parameters by other tensors of the same names and shapes (LoRA's merged
  weights).
- `sharded_state(model, optimizer, trainable_only=False)`: this rank's model and optimizer state as
  DCP saves it (shards as DTensors; `trainable_only`: frozen parameters left out, LoRA's base); `save_sharded(dir, state, group)` writes such a state (a copy of it: the write may
  run while training goes on) with `torch.distributed.checkpoint`, every rank its shards, fsynced,
  its collectives on `group`; when it returns on rank 0, every rank's files are written (DCP's
  last step gathers every rank's write result before rank 0 writes the metadata).
  `load_sharded(dir, model, optimizer, trainable_only=False)` reads it back, and `full_state(model)`: the full parameters
  on rank 0 (CPU), for the checkpoint's `hf/` export.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from orchestrator.backends.model import FlatLayout, Slot, torch_dtype

DCP_DIR = "dcp"


@dataclass
class RankGroup:
    rank: int
    world: int
    strategy: str
    device: torch.device
    control: object = None      # the gloo group of commands
    saves: object = None        # the gloo group of checkpoint writes (a writer thread's collectives)

    @classmethod
    def from_env(cls, actor_cfg, device: torch.device) -> "RankGroup":
        timeout = datetime.timedelta(seconds=actor_cfg.collective_timeout_s)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
            control = dist.new_group(backend="gloo", timeout=timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
            control = dist.group.WORLD
        saves = dist.new_group(backend="gloo", timeout=timeout)
        return cls(rank, world, actor_cfg.strategy, device, control, saves)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def command(self, kind: int, payload: bytes = b"") -> None:
        """Rank 0: broadcast one command to every rank."""
        head = torch.tensor([kind, len(payload)], dtype=torch.int64)
        dist.broadcast(head, 0, group=self.control)
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), 0,
                           group=self.control)

    def receive(self) -> tuple[int, bytes]:
        """Other ranks: the next command of rank 0."""
        head = torch.empty(2, dtype=torch.int64)
        dist.broadcast(head, 0, group=self.control)
        kind, n = int(head[0]), int(head[1])
        if not n:
            return kind, b""
        buf = torch.empty(n, dtype=torch.uint8)
        dist.broadcast(buf, 0, group=self.control)
        return kind, buf.numpy().tobytes()

    def reduce(self, values: list[float], op: str = "sum") -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._reduce_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return [float(v) for v in t.cpu()]

    @property
    def _reduce_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def share(model, actor_cfg, group: Optional[RankGroup]):
    """The model as the ranks train it (see the module contract)."""
    if actor_cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    strategy = actor_cfg.strategy
    if strategy == "none":
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        ids = [group.device] if group.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(group.device.type, (group.world,))
    policy = MixedPrecisionPolicy(
        param_dtype=torch_dtype(actor_cfg.param_dtype) if actor_cfg.param_dtype else None,
        reduce_dtype=torch_dtype(actor_cfg.reduce_dtype) if actor_cfg.reduce_dtype else None)
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def share_frozen(model, actor_cfg, group: Optional[RankGroup]):
    """The forward-only model as the ranks hold it (see the module contract)."""
    model.requires_grad_(False)
    if actor_cfg.strategy != "fsdp":
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(group.device.type, (group.world,))
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _decoder_layers(model) -> list:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def unwrap(model):
    """The HF model under a DDP wrapper (FSDP2 keeps the module itself)."""
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" \
        else model


def local_tensor(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def shard_writes(model, layout: FlatLayout, rank: int, world: int, strategy: str,
                 source=None) -> Iterator[tuple[Slot, int, torch.Tensor]]:
    """`source`: a mapping layout name -> tensor to write instead of the model's parameter of that
    name (LoRA's merged weights: `lora.MergedSource`); read lazily, one slot at a time, and under
    fsdp for every slot in layout order (it may be a collective)."""
    params = source if source is not None else dict(unwrap(model).named_parameters())
    if strategy == "fsdp":
        for s in layout.slots:
            local = local_tensor(params[s.name]).detach()
            if not s.numel or not local.numel():
                continue
            rows = -(-s.shape[0] // world)                     # ceil: FSDP2's dim-0 chunk
            row_bytes = s.nbytes // s.shape[0]
            yield s, rank * rows * row_bytes, local
        return
    loads = [0] * world
    for s in sorted(layout.slots, key=lambda s: (-s.nbytes, s.offset)):
        r = min(range(world), key=lambda r: (loads[r], r))
        loads[r] += s.nbytes
        if r == rank:
            yield s, 0, params[s.name].detach()


def write_shards(writes, view_of) -> None:
    """Copy each piece into `view_of(offset, dtype, numel)`, a tensor view of the flat buffer."""
    with torch.no_grad():
        for s, at, t in writes:
            if t.numel():
                view_of(s.offset + at, s.dtype, t.numel()).copy_(t.reshape(-1))


# ------------------------------------------------------------------------------- checkpoints

def _options(trainable_only: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # loading only the trainable part leaves the frozen keys missing on purpose: not strict then
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def sharded_state(model, optimizer, trainable_only: bool = False) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer, options=_options(trainable_only))
    return {"model": msd, "optim": osd}


def save_sharded(directory: str, state: dict, group) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, process_group=group,
             storage_writer=dcp.FileSystemWriter(os.path.join(directory, DCP_DIR), sync_files=True))


def load_sharded(directory: str, model, optimizer, trainable_only: bool = False) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = os.path.join(directory, DCP_DIR)
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint {directory} has no sharded state ({DCP_DIR}/): it was written "
                         f"by a single-rank trainer")
    state = sharded_state(model, optimizer, trainable_only)
    dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=_options(trainable_only))


def full_state(model) -> dict[str, torch.Tensor]:
    """Every parameter in full on rank 0 (CPU), empty elsewhere; a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
