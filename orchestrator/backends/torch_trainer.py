"""Built-in torch trainer backend: PPO / decoupled-PPO steps on columnar batches.

Contract (TrainerBackend of base.py):
- `TorchTrainer(model_cfg, actor_cfg, task_cfg, seed, device, temperature=1.0)` builds the same
  version-0 model as TorchInference (`build_model(model_cfg, vocab, seed)`) and an Adam optimizer
  (`actor.lr`). Logprobs are log_softmax(logits / temperature), the distribution inference samples
  from. On CPU it sets torch's intra-op threads to `actor.threads` (a process-wide setting).
- `train_step(batch)`: per-sequence `batch.advantages` broadcast to the loss-masked tokens; behaviour
  logprobs are `batch.logprobs`. With `actor.recompute_logprob`, the logprobs of the current policy
  are recomputed once before the update (no grad) as the proximal policy. Loss (orchestrator.loss):
  decoupled objective when `actor.use_decoupled_loss`; otherwise the standard clip against the
  recomputed logprobs when recomputing (AReaL's choice), else against the behaviour logprobs. Then
  `actor.ppo_epochs` full-batch passes of (PPO loss - `actor.entropy_coef` x mean entropy of the
  loss-masked tokens), each: backward, clip grad norm to `actor.max_grad_norm`, Adam step. A batch
  with no loss-masked token, or only zero advantages and no entropy bonus, is skipped: no update, stats
  with loss 0 and skipped 1. Stats are python floats: loss, clip_frac, imp_weight_mean,
  behav_capped_frac, approx_kl, grad_norm, tokens, sequences, skipped, steps (updates so far), and
  when recomputing: logprob_diff_mean / logprob_diff_max / logprob_diff_tokens, the |recomputed -
  behaviour| logprob over loss-masked tokens sampled at `batch.version` (the weights the trainer
  holds): inference and trainer disagreeing on the same weights (a silent weight-load bug, a
  kernel or dtype mismatch) shows here.
- `weight_nbytes()` / `write_weights(out)`: the flat layout of orchestrator.model.
- `save(dir)` / `load(dir)`: `hf/` (an HF model directory: config, generation config, safetensors
  weights, tokenizer files; what `AutoModelForCausalLM.from_pretrained` and vLLM load as is, and what
  `load` reads the weights back from) and `optimizer.pt` (Adam state, step count, RNG states). The
  checkpoint commit fsyncs and checksums them; `load` also reads the `model.safetensors` of older
  checkpoints.
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Optional

import numpy as np
import torch

from orchestrator.loss import masked_mean, ppo_loss
from orchestrator.data.tokens import load_tokens
from orchestrator.model import (build_model, export_hf, flat_layout, resolve_device, write_flat,
                                write_flat_tensor)
from shm.codec import Sequences

MODEL_FILE, OPTIM_FILE, HF_DIR = "model.safetensors", "optimizer.pt", "hf"


def pad_batch(batch: Sequences, pad_id: int) -> dict[str, np.ndarray]:
    """Right-padded [n, L] arrays: ids, attention, behaviour logprobs, loss mask, advantages."""
    n = batch.n
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    lens = np.diff(offsets)
    width = int(lens.max()) if n else 0
    ids = np.full((n, width), pad_id, dtype=np.int64)
    attn = np.zeros((n, width), dtype=np.int64)
    behav = np.zeros((n, width), dtype=np.float32)
    mask = np.zeros((n, width), dtype=bool)
    adv = np.zeros((n, width), dtype=np.float32)
    vers = np.full((n, width), -1, dtype=np.int64)
    for i in range(n):
        a, b = int(offsets[i]), int(offsets[i + 1])
        k = b - a
        ids[i, :k] = batch.tokens[a:b]
        attn[i, :k] = 1
        behav[i, :k] = batch.logprobs[a:b]
        mask[i, :k] = np.asarray(batch.loss_mask[a:b], dtype=bool)
        adv[i, :k] = float(batch.advantages[i])
        vers[i, :k] = batch.versions[a:b]
    if width:
        mask[:, 0] = False  # the first token has no predicting position
    return {"ids": ids, "attn": attn, "behav": behav, "mask": mask, "adv": adv, "vers": vers}


def token_logprobs(model, ids: torch.Tensor, attn: torch.Tensor, temperature: float,
                   with_entropy: bool = False):
    """[n, L] logprob of token t given tokens < t (column 0 is 0); with_entropy: also the [n, L]
    entropy of the sampling distribution at each position (column 0 is 0)."""
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1, :].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    picked = torch.nn.functional.pad(logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1), (1, 0))
    if not with_entropy:
        return picked
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, torch.nn.functional.pad(entropy, (1, 0))


class TorchTrainer:
    def __init__(self, model_cfg, actor_cfg, task_cfg, seed: int, device="cpu", temperature: float = 1.0,
                 total_steps: int = 1):
        self.cfg = actor_cfg
        self.total_steps = total_steps
        self.device = resolve_device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(actor_cfg.threads)
        self.temperature = float(temperature)
        self.tokens = load_tokens(model_cfg.path)
        self.pad_id = self.tokens.pad_id
        self.model = build_model(model_cfg, len(self.tokens.tokenizer), seed).to(self.device)
        self.layout = flat_layout(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=actor_cfg.lr)
        self.steps = 0

    def lr_at(self, step: int) -> float:
        """Learning rate for 1-based trainer step `step` (a pure function: resume-safe)."""
        base = self.cfg.lr
        if self.cfg.lr_schedule == "constant" or self.total_steps <= 1:
            return base
        frac = min(1.0, max(0.0, (step - 1) / (self.total_steps - 1)))
        floor = self.cfg.lr_min_ratio
        return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))

    # ------------------------------------------------------------------ training
    def _tensors(self, batch: Sequences) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(v).to(self.device) for k, v in pad_batch(batch, self.pad_id).items()}

    @torch.no_grad()
    def compute_logprobs(self, batch: Sequences) -> np.ndarray:
        """Per-token logprobs of `batch` under the current weights, in the batch's flat layout."""
        t = self._tensors(batch)
        self.model.eval()
        lp = token_logprobs(self.model, t["ids"], t["attn"], self.temperature).cpu().numpy()
        out = np.zeros(len(batch.tokens), dtype=np.float32)
        for i in range(batch.n):
            a, b = int(batch.offsets[i]), int(batch.offsets[i + 1])
            out[a:b] = lp[i, : b - a]
        return out

    def train_step(self, batch: Sequences) -> dict[str, float]:
        t = self._tensors(batch)  # an empty batch (n == 0) is skipped like one without signal
        mask = t["mask"]
        n_tok = int(mask.sum())
        base = {"loss": 0.0, "clip_frac": 0.0, "imp_weight_mean": 1.0, "behav_capped_frac": 0.0,
                "approx_kl": 0.0, "grad_norm": 0.0, "tokens": float(n_tok),
                "sequences": float(batch.n), "skipped": 1.0, "steps": float(self.steps)}
        coef = self.cfg.entropy_coef
        if n_tok == 0 or (coef == 0 and not bool((t["adv"][mask] != 0).any())):
            return base

        behav = t["behav"]
        prox: Optional[torch.Tensor] = None
        mismatch: dict[str, float] = {}
        if self.cfg.recompute_logprob:
            self.model.eval()
            with torch.no_grad():
                prox = token_logprobs(self.model, t["ids"], t["attn"], self.temperature)
            same = mask & (t["vers"] == batch.version)  # sampled by the weights recomputed here
            if bool(same.any()):
                diff = (prox - behav).abs()[same]
                mismatch = {"logprob_diff_mean": float(diff.mean()),
                            "logprob_diff_max": float(diff.max()),
                            "logprob_diff_tokens": float(same.sum())}
            if not self.cfg.use_decoupled_loss:
                behav, prox = prox, None  # standard PPO anchored at the recomputed policy

        lr = self.lr_at(batch.ident)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        totals: dict[str, float] = {}
        for _ in range(self.cfg.ppo_epochs):
            lp, ent = token_logprobs(self.model, t["ids"], t["attn"], self.temperature, True)
            loss, stats = ppo_loss(lp, prox, behav, t["adv"], mask, self.cfg.eps_clip,
                                   self.cfg.use_decoupled_loss, self.cfg.behav_imp_weight_cap)
            entropy = masked_mean(ent, mask.bool())
            if coef:
                loss = loss - coef * entropy      # keeps exploring once groups stop disagreeing
            stats["entropy"] = float(entropy.detach())
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            stats["grad_norm"] = float(gn)
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
        self.model.eval()
        self.steps += 1
        out = {k: v / self.cfg.ppo_epochs for k, v in totals.items()}
        out.update(tokens=float(n_tok), sequences=float(batch.n), skipped=0.0, steps=float(self.steps),
                   lr=lr, **mismatch)
        return out

    # ------------------------------------------------------------------ weights
    def weight_nbytes(self) -> int:
        return self.layout.nbytes

    def write_weights(self, out: memoryview) -> None:
        write_flat(self.model, out, self.layout)

    def write_weights_tensor(self, out: torch.Tensor) -> None:
        """CUDA IPC path: fill a uint8 buffer on the trainer's device."""
        write_flat_tensor(self.model, out, self.layout)

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        export_hf(self.model, self.tokens.tokenizer, os.path.join(directory, HF_DIR))
        state = {"optimizer": self.optimizer.state_dict(), "steps": self.steps,
                 "rng_cpu": torch.get_rng_state(),
                 "rng_cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else []}
        _atomic(directory, OPTIM_FILE, lambda path: torch.save(state, path))

    def load(self, directory: str) -> None:
        tensors = read_weights(directory)
        params = dict(self.model.named_parameters())
        if set(tensors) != set(params):
            extra, missing = sorted(set(tensors) - set(params)), sorted(set(params) - set(tensors))
            raise ValueError(f"checkpoint {directory} does not match the model's parameters "
                             f"(unexpected {extra[:3]}, missing {missing[:3]})")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(tensors[name])
        state = torch.load(os.path.join(directory, OPTIM_FILE), map_location=self.device,
                           weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        if "rng_cpu" in state:
            torch.set_rng_state(state["rng_cpu"].cpu())
            if state["rng_cuda"]:
                torch.cuda.set_rng_state_all([s.cpu() for s in state["rng_cuda"]])

    def close(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)


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
