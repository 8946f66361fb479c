"""The torch trainer's checkpoints: what `TorchTrainer` (torch_trainer.py) saves and loads, as a
mixin over the trainer's own attributes (model, module, optimizer, peft, base, ref_hash, group,
device, steps).

Contract:
- `snapshot()` -> `write(dir)`: the checkpoint's state copied now, written later (in a writer
  thread while training goes on; see `snapshot`). `save(dir)` / `load(dir)`: one rank: `hf/` (an
  HF model directory: config, generation config, safetensors weights, tokenizer files; what
  `AutoModelForCausalLM.from_pretrained` and vLLM load as is, and what `load` reads the weights
  back from) and `optimizer.pt` (Adam state, step count, RNG states); `load` also reads the
  `model.safetensors` of older checkpoints. Ranks (a collective): `dcp/`, `hf/` from rank 0,
  `trainer_state.pt` and `ranks.json` (see `save`); `load` refuses a checkpoint of another world
  size or sharding. The checkpoint commit fsyncs and checksums them.
- LoRA: `adapter/` (a peft adapter directory) instead of `hf/`, the adapters' optimizer state
  only (two Adam groups: a checkpoint with another count is refused), and `lora` (the base's path
  and weights hash, rank, alpha, targets): `load` refuses another base (naming both), other
  adapter shapes, and a full fine-tune's checkpoint (or a LoRA one without `actor.lora`).
- `read_weights(dir)`: a one-rank checkpoint's weights by name (`hf/`, or an older
  `model.safetensors`).
"""
from __future__ import annotations

import json
import os
import tempfile

import torch

from orchestrator.backends import sharding
from orchestrator.backends.model import export_hf
from orchestrator.backends.trainer_files import (ADAPTER_DIR, HF_DIR, MODEL_FILE, OPTIM_FILE,
                                                 RANK_STATE, RANKS_FILE)


class TrainerCheckpoint:
    """Checkpoint methods of TorchTrainer (see the module contract)."""

    def _rng(self) -> dict:
        return {"rng_cpu": torch.get_rng_state(),
                "rng_cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else []}

    @property
    def background_save(self) -> bool:
        """`snapshot()` lets the checkpoint be written while training goes on (ranks too)."""
        return True

    def snapshot(self):
        """Copy what a checkpoint holds now and return `write(directory)`, which writes it from
        that copy only: it may run in another thread while the next batches train. One rank: the
        weights and Adam state, step count and RNG go to CPU; `write` makes `hf/` + `optimizer.pt`.
        Ranks (every rank calls both, in the same order): each copies its shards of the model and
        optimizer state, and rank 0 gathers the full weights for `hf/` (the only collective on the
        training path); `write` is DCP's collective save on the group's `saves` group, then rank 0
        writes `hf/`, `trainer_state.pt` and `ranks.json`. When rank 0's `write` returns, every
        rank's part is on disk."""
        state = _to_cpu({"steps": self.steps, **self._rng()})
        if self.ref_hash is not None:
            state["ref_hash"] = self.ref_hash
        model_files = self._model_files(state)
        if self.group is None:
            state["optimizer"] = _to_cpu(self.optimizer.state_dict())

            def write(directory: str) -> None:
                os.makedirs(directory, exist_ok=True)
                model_files(directory)
                _atomic(directory, OPTIM_FILE, lambda path: torch.save(state, path))
            return write

        shards = _to_cpu(sharding.sharded_state(self.model, self.optimizer,
                                                trainable_only=self.peft is not None))
        rank, group = self.rank, self.group
        meta = json.dumps({"world_size": self.world, "sharding": self.strategy}).encode()

        def write_ranks(directory: str) -> None:
            os.makedirs(directory, exist_ok=True)
            sharding.save_sharded(directory, shards, group.saves)
            if rank == 0:
                model_files(directory)
                _atomic(directory, RANK_STATE, lambda path: torch.save(state, path))
                _atomic(directory, RANKS_FILE, lambda path: open(path, "wb").write(meta))
        return write_ranks

    def _model_files(self, state: dict):
        """Copy the model part of a checkpoint now; return what writes it into a directory. Full
        fine-tuning: the weights as `hf/` (with ranks gathered: a collective). LoRA: `adapter/` (a
        peft adapter directory, the adapters in full, gathered likewise) instead of `hf/`, and the
        state names the base (`lora`: its path, weights hash, rank, alpha and targets); with ranks
        the sharded state (`dcp/`) then holds only the adapters and their Adam state."""
        if self.peft is not None:
            import copy

            from orchestrator.backends import lora
            state["lora"] = dict(self.base)
            config = copy.deepcopy(self.peft.peft_config[lora.ADAPTER])
            tensors = lora.adapter_tensors(self.peft)

            def adapter(directory: str) -> None:
                lora.write_adapter(os.path.join(directory, ADAPTER_DIR), config, tensors)
            return adapter
        module, tokenizer = self.module, self.tokens.tokenizer
        weights = _to_cpu(self.module.state_dict() if self.group is None
                          else sharding.full_state(self.model))

        def hf(directory: str) -> None:
            export_hf(module, tokenizer, os.path.join(directory, HF_DIR), weights)
        return hf

    def save(self, directory: str) -> None:
        """`snapshot()` written at once: one rank `hf/` + `optimizer.pt`; ranks (every rank calls
        it) `dcp/` (each rank its shards), `hf/` exported by rank 0 from the gathered parameters,
        `trainer_state.pt` and `ranks.json` (world size and sharding: a resume must match them),
        all of it written when `save` returns on any rank."""
        self.snapshot()(directory)
        if self.group is not None:
            self.group.barrier()

    def load(self, directory: str) -> None:
        if self.group is not None:
            self._load_sharded(directory)
            return
        if os.path.exists(os.path.join(directory, RANKS_FILE)):
            raise ValueError(f"checkpoint {directory} was written by {_ranks(directory)}: resume "
                             f"with the same actor.num_ranks / actor.devices")
        state = torch.load(os.path.join(directory, OPTIM_FILE), map_location=self.device,
                           weights_only=True)
        self._check_reference(state, directory)           # before anything is changed
        self._check_base(state, directory)
        if self.peft is not None:
            from orchestrator.backends import lora
            lora.load_adapter(self.peft, lora.read_adapter(os.path.join(directory, ADAPTER_DIR))[1])
            groups = len(state["optimizer"]["param_groups"])
            if groups != len(self.optimizer.param_groups):     # one: written before LoRA+ (#39)
                raise ValueError(f"checkpoint {directory} holds {groups} optimizer parameter "
                                 f"group(s), this run's LoRA trains {len(self.optimizer.param_groups)} "
                                 f"(A and B): resume it with the code that wrote it")
            self.optimizer.load_state_dict(state["optimizer"])
            self._restore(state)
            return
        tensors = read_weights(directory)
        params = dict(self.model.named_parameters())
        if set(tensors) != set(params):
            extra, missing = sorted(set(tensors) - set(params)), sorted(set(params) - set(tensors))
            raise ValueError(f"checkpoint {directory} does not match the model's parameters "
                             f"(unexpected {extra[:3]}, missing {missing[:3]})")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(tensors[name])
        self.optimizer.load_state_dict(state["optimizer"])
        self._restore(state)

    def _load_sharded(self, directory: str) -> None:
        if not os.path.exists(os.path.join(directory, RANKS_FILE)):
            raise ValueError(f"checkpoint {directory} was written by one trainer rank: resume with "
                             f"one (actor.num_ranks=1, no actor.devices)")
        saved = json.loads(open(os.path.join(directory, RANKS_FILE), "rb").read())
        if saved != {"world_size": self.world, "sharding": self.strategy}:
            raise ValueError(f"checkpoint {directory} was written by {_ranks(directory)}, this run "
                             f"has {self.world} ranks sharded by {self.strategy}")
        state = torch.load(os.path.join(directory, RANK_STATE), map_location="cpu", weights_only=True)
        self._check_reference(state, directory)
        self._check_base(state, directory)
        sharding.load_sharded(directory, self.model, self.optimizer,
                              trainable_only=self.peft is not None)
        self._restore(state)

    def _check_reference(self, state: dict, directory: str) -> None:
        """A checkpoint trained against a KL reference resumes only against the same one."""
        saved = state.get("ref_hash")
        if saved is not None and self.ref_hash is not None and saved != self.ref_hash:
            raise ValueError(f"checkpoint {directory} was trained against another KL reference "
                             f"model (weights hash {saved[:16]}, this run's {self.ref_hash[:16]}): "
                             f"resume with the same actor.ref_path / model")

    def _check_base(self, state: dict, directory: str) -> None:
        """A LoRA checkpoint resumes only as LoRA of the same rank, alpha and targets on the same
        base weights; a full fine-tune's only without LoRA."""
        saved = state.get("lora")
        if saved is None and self.base is None:
            return
        if saved is None:
            raise ValueError(f"checkpoint {directory} holds a full fine-tune, not LoRA adapters: "
                             f"resume without actor.lora (or start a new run.dir)")
        if self.base is None:
            raise ValueError(f"checkpoint {directory} holds LoRA adapters (rank {saved['rank']}): "
                             f"resume with the same actor.lora")
        if saved["hash"] != self.base["hash"]:
            def name(base: dict) -> str:
                return f"model.path={base['path']}" if base["path"] else "the built-in model of run.seed"
            raise ValueError(f"checkpoint {directory} trained adapters on another base model: "
                             f"{name(saved)} (weights hash {saved['hash'][:16]}), this run's "
                             f"{name(self.base)} (weights hash {self.base['hash'][:16]})")
        for key in ("rank", "alpha", "target_modules"):
            if saved[key] != self.base[key]:
                raise ValueError(f"checkpoint {directory} holds adapters of actor.lora.{key}="
                                 f"{saved[key]}, this run has {self.base[key]}")

    def _restore(self, state: dict) -> None:
        self.steps = int(state["steps"])
        if "rng_cpu" in state:
            torch.set_rng_state(state["rng_cpu"].cpu())
            if state["rng_cuda"]:
                torch.cuda.set_rng_state_all([s.cpu() for s in state["rng_cuda"]])


def _to_cpu(tree):
    """A copy of a state tree with every tensor cloned to CPU (nothing shared with the live one)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_cpu(v) for v in tree)
    return tree


def _ranks(directory: str) -> str:
    try:
        saved = json.loads(open(os.path.join(directory, RANKS_FILE), "rb").read())
        return f"{saved['world_size']} ranks sharded by {saved['sharding']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "several ranks"


def read_weights(directory: str) -> dict[str, torch.Tensor]:
    """Parameters saved by `save`: every safetensors file of `hf/` (a sharded save included), or the
    `model.safetensors` of checkpoints written before `hf/` existed."""
    from safetensors.torch import load_file

    hf = os.path.join(directory, HF_DIR)
    if not os.path.isdir(hf):
        return load_file(os.path.join(directory, MODEL_FILE))
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(hf)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(hf, name)))
    return tensors


def _atomic(directory: str, name: str, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

