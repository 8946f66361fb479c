"""Built-in torch trainer backend: PPO / decoupled-PPO steps on columnar batches, on one rank or
as one of several (orchestrator.backends.sharding).

Contract (TrainerBackend of base.py):
- `TorchTrainer(model_cfg, actor_cfg, task_cfg, seed, device, temperature=1.0, total_steps=1,
  group=None)` builds the same version-0 model as TorchInference (`build_model(model_cfg, vocab,
  seed)`), shares it among the ranks of `group` (FSDP2 or DDP, `sharding.share`) and builds an Adam
  optimizer (`actor.lr`) over what this rank holds. Logprobs are log_softmax(logits / temperature),
  the distribution inference samples from. On CPU it sets torch's intra-op threads to
  `actor.threads` (a process-wide setting).
- `train_step(batch)`: every rank calls it with the whole batch and trains its share: sequences are
  dealt to ranks by tokens and cut into micro-batches of `actor.micro_batch_tokens`
  (orchestrator.backends.microbatch; padded, or packed into one row with `actor.pack_sequences`).
  Per-sequence `batch.advantages` are broadcast to the loss-masked tokens; behaviour logprobs are
  `batch.logprobs`. With `actor.recompute_logprob`, the logprobs of the current policy are
  recomputed once before the update (no grad) as the proximal policy. Loss (orchestrator.algo):
  `policy_loss(algo.policy_loss)` with clip [1 - actor.eps_clip, 1 + (actor.eps_clip_higher or
  eps_clip)] and dual clip actor.c_clip, anchored at the recomputed logprobs when recomputing
  (AReaL's choice), else at the behaviour logprobs; each token weighted by the behaviour weight
  w = exp(recomputed - behaviour) of `rollout_correction`: AReaL's decoupled objective
  (`actor.use_decoupled_loss`: mis at token level, w kept up to `actor.behav_imp_weight_cap`) or
  `algo.rollout_correction` (tis / mis at token, sequence or geometric level); aggregated by
  `algo.loss_agg_mode` (`agg_loss`). Then `actor.ppo_epochs` passes over the batch of (that loss -
  `actor.entropy_coef` x the entropy of the loss-masked tokens, aggregated the same way), each:
  backward per micro-batch (gradients accumulate; each micro-batch's aggregate is weighted by its
  share of the batch's `agg_units`, so the loss is the whole batch's whatever the split; packed
  rows are laid out one sequence per row for the loss), clip grad norm to `actor.max_grad_norm`,
  Adam step. With `actor.kl_ctl` > 0 a frozen reference model (`actor.ref_path`, else the initial
  weights: model.path or the tiny model of `seed`; in `actor.ref_dtype`), shared like the actor
  (`sharding.share_frozen`), gives reference logprobs once per step (no grad), and the loss gains
  kl_ctl x `agg_loss(kl_penalty(logprobs, ref, algo.kl_estimator))`; stats `kl_ref_mean` (the
  token-mean KL of the first pass, the policy before this step's update: 0 while the policy is the
  reference) and `kl_ref_loss` (the aggregate, averaged over passes). The reference is not in
  checkpoints: its hash (`ref_hash`, blake2b of its weights as loaded) is, and `load` refuses a
  checkpoint trained against another reference. A batch with no loss-masked token, or only zero
  advantages, no entropy bonus and no KL term, is skipped (on
  every rank alike): no update, stats with loss 0 and skipped 1. Stats (summed over ranks) are
  python floats: loss, clip_frac, dual_clip_frac, ratio_mean, entropy, imp_weight_mean and
  behav_capped_frac (the behaviour weight's mean and the fraction of tokens it truncated or
  dropped; 1 and 0 without one), approx_kl, grad_norm, tokens,
  sequences, skipped, steps (updates so far), and when recomputing: logprob_diff_mean /
  logprob_diff_max / logprob_diff_tokens, the |recomputed - behaviour| logprob over loss-masked
  tokens sampled at `batch.version` (the weights the trainer holds): inference and trainer
  disagreeing on the same weights (a silent weight-load bug, a kernel or dtype mismatch) shows here.
- LoRA (`actor.lora`, orchestrator.backends.lora): peft adapters on the frozen base (sharded as
  the full model is); only the adapters take gradients and Adam state, B at actor.lr x
  lora.lr_scale and A at that / lora.loraplus_lr_ratio (two Adam groups). The flat layout stays the
  base model's, and what is published into it is base + scaling x B @ A (`lora.MergedSource`), so
  inference loads it as it loads full weights. `adapter_only` (inference.vllm.lora): the flat
  layout is the adapters' own (`lora.adapter_layout`) and what is published is A and B of each
  target layer, gathered onto rank 0 (one collective under FSDP2 on CPU; they are small) and
  written by rank 0 alone (`write_adapters(out)` into a buffer of `adapter_layout`; every LoRA trainer has
  both, so the bench compares the two publishes).
- `weight_nbytes()` / `write_weights(out)`: the flat layout of orchestrator.backends.model; each rank writes
  its own part (`sharding.shard_writes`). `write_weights_tensor(buf)`: the whole layout into rank 0's
  GPU buffer (the CUDA IPC path; a gather every rank joins).
- Checkpoints (`snapshot`, `save`, `load`): orchestrator.backends.trainer_checkpoint.
"""
from __future__ import annotations

import contextlib
import math
from typing import Optional

import numpy as np
import torch

from orchestrator.algo import agg_loss, agg_units, kl_penalty, policy_loss, rollout_correction
from orchestrator.algo.schedule import lr_at
from orchestrator.backends import sharding
from orchestrator.backends.batch_tensors import (_sequence_rows, pack_batch,  # noqa: F401
                                                 pad_batch, token_logprobs)   # (re-exported)
from orchestrator.backends.microbatch import plan
from orchestrator.backends.model import (build_model, flat_layout, flat_views, resolve_device,
                                         write_flat_tensor)
from orchestrator.backends.trainer_checkpoint import TrainerCheckpoint, read_weights  # noqa: F401
from orchestrator.backends.trainer_files import weights_hash
from orchestrator.config import AlgoConfig
from orchestrator.data.tokens import load_tokens
from shm.codec import Sequences


AGGREGATES = ("loss", "entropy", "kl_ref_loss")     # step stats that are the batch's aggregate (weighted by units)


class TorchTrainer(TrainerCheckpoint):
    def __init__(self, model_cfg, actor_cfg, task_cfg, seed: int, device="cpu", temperature: float = 1.0,
                 total_steps: int = 1, group: Optional[sharding.RankGroup] = None,
                 algo: Optional[AlgoConfig] = None, adapter_only: bool = False):
        self.cfg = actor_cfg
        self.algo = algo if algo is not None else AlgoConfig()
        self.total_steps = total_steps
        self.device = resolve_device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(actor_cfg.threads)
        self.temperature = float(temperature)
        self.tokens = load_tokens(model_cfg.path)
        self.pad_id = self.tokens.pad_id
        self.group = group
        self.rank, self.world = (group.rank, group.world) if group else (0, 1)
        self.strategy = actor_cfg.strategy if group else "none"
        module = build_model(model_cfg, len(self.tokens.tokenizer), seed)
        self.layout = flat_layout(module)               # the base model's: what inference loads
        self.peft, self.base = None, None
        if actor_cfg.lora is not None:                  # adapters on a frozen base (backends.lora)
            from orchestrator.backends import lora
            self.base = {"path": model_cfg.path, "hash": weights_hash(module),
                         **lora.signature(actor_cfg.lora, module)}
            self.peft = lora.wrap(module, actor_cfg.lora, seed, model_cfg.path)
            self.adapter_layout = lora.adapter_layout(self.peft)
            if adapter_only:                            # only A and B travel (inference.vllm.lora)
                self.layout = self.adapter_layout
        elif adapter_only:
            raise ValueError("adapter-only publishing (inference.vllm.lora) needs actor.lora")
        self.adapter_only = adapter_only
        self.model = sharding.share(module.to(self.device), actor_cfg, group)
        self.module = sharding.unwrap(self.model)     # the HF model (its parameters may be shards)
        self.trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self._param_groups(), lr=actor_cfg.lr)
        self.steps = 0
        self.ref, self.ref_hash = None, None
        if actor_cfg.kl_ctl > 0:
            self.ref, self.ref_hash = self._reference(model_cfg, seed)
        if actor_cfg.pack_sequences:
            self._check_packing()

    def _reference(self, model_cfg, seed: int):
        """The frozen reference model of the KL term, shared like the actor, and its hash."""
        update = {"dtype": self.cfg.ref_dtype or model_cfg.dtype}
        if self.cfg.ref_path is not None:
            update["path"] = self.cfg.ref_path
        module = build_model(model_cfg.model_copy(update=update), len(self.tokens.tokenizer), seed)
        digest = weights_hash(module)
        ref = sharding.share_frozen(module.to(self.device), self.cfg, self.group)
        return ref.eval(), digest

    @torch.no_grad()
    def _ref_logprobs(self, parts: list[dict]) -> list[torch.Tensor]:
        out = [token_logprobs(self.ref, t, self.temperature) for t in parts]
        if self.strategy == "fsdp":
            self.ref.reshard()
        return out

    @torch.no_grad()
    def _check_packing(self) -> None:
        """Packed rows are right only where the attention implementation keeps each sequence to
        itself given restarting position ids: compare one packed pass with the padded one."""
        lens = [5, 3]
        ids = np.arange(sum(lens), dtype=np.int32) % max(2, len(self.tokens.tokenizer) - 1) + 1
        probe = Sequences(kind=0, ident=0, version=0, offsets=np.array([0, 5, 8], dtype=np.int64),
                          prompt_lens=np.ones(2, np.int32), prompt_ids=np.zeros(2, np.int64),
                          tokens=ids, logprobs=np.zeros(8, np.float32),
                          versions=np.zeros(8, np.int32), loss_mask=np.ones(8, np.uint8),
                          rewards=np.zeros(2, np.float32), advantages=np.zeros(2, np.float32),
                          scalars=np.zeros(0))
        self.model.eval()
        packed = token_logprobs(self.model, self._tensors(probe, [0, 1]), self.temperature)[0]
        padded = token_logprobs(self.model, self._tensors(probe), self.temperature)   # rows None
        self._forward_done()
        got = torch.cat([packed[1:5], packed[6:8]]).float().cpu()   # not the sequences' first tokens
        want = torch.cat([padded[0, 1:5], padded[1, 1:3]]).float().cpu()
        if not torch.allclose(got, want, atol=1e-3):
            raise ValueError(f"actor.pack_sequences: this model's attention "
                             f"({getattr(self.module.config, '_attn_implementation', '?')}) does "
                             f"not keep packed sequences apart (max logprob difference "
                             f"{float((got - want).abs().max()):.3g}); turn it off")

    def _param_groups(self) -> list[dict]:
        """Adam's parameter groups, each with its `lr_scale` (its rate over the schedule's): one
        group of everything trained; with LoRA, A at lr_scale / loraplus_lr_ratio, then B at
        lr_scale (the step line's lr is the last group's)."""
        lora = self.cfg.lora
        if lora is None:
            return [{"params": self.trained, "lr_scale": 1.0}]
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if ".lora_A." in n],
                 "lr_scale": lora.lr_scale / lora.loraplus_lr_ratio},
                {"params": [p for n, p in named if ".lora_A." not in n], "lr_scale": lora.lr_scale}]

    def lr_at(self, step: int) -> float:
        """Learning rate for 1-based trainer step `step` (algo.schedule: resume-safe)."""
        c = self.cfg
        return lr_at(step, lr=c.lr, total_steps=self.total_steps, schedule=c.lr_schedule,
                     min_ratio=c.lr_min_ratio, warmup_steps=c.lr_warmup_steps)

    # ------------------------------------------------------------------ training
    def _tensors(self, batch: Sequences, rows: Optional[list[int]] = None) -> dict[str, torch.Tensor]:
        """Padded tensors of `rows`; an empty micro-batch (`[]`, only where ranks must run as many
        passes as each other) is sequence 0 with no loss-masked token: a pass of zero weight."""
        take = rows if rows != [] else [0]
        if self.cfg.pack_sequences and rows is not None:
            t = pack_batch(batch, self.pad_id, take)
        else:
            t = pad_batch(batch, self.pad_id, take if rows is not None else None)
        if rows == []:
            t["mask"][:] = False
        return {k: torch.from_numpy(v).to(self.device) for k, v in t.items()}

    def _forward_done(self) -> None:
        """FSDP2 keeps the root's parameters gathered after a forward without backward."""
        if self.strategy == "fsdp":
            self.model.reshard()

    def _sync_grads(self, on: bool):
        if self.strategy == "fsdp":
            self.model.set_requires_gradient_sync(on)
            return contextlib.nullcontext()
        if self.strategy == "ddp" and not on:
            return self.model.no_sync()
        return contextlib.nullcontext()

    @torch.no_grad()
    def compute_logprobs(self, batch: Sequences) -> np.ndarray:
        """Per-token logprobs of `batch` under the current weights, in the batch's flat layout
        (one rank)."""
        t = self._tensors(batch)
        self.model.eval()
        lp = token_logprobs(self.model, t, self.temperature).cpu().numpy()
        self._forward_done()
        out = np.zeros(len(batch.tokens), dtype=np.float32)
        for i in range(batch.n):
            a, b = int(batch.offsets[i]), int(batch.offsets[i + 1])
            out[a:b] = lp[i, : b - a]
        return out

    def train_step(self, batch: Sequences) -> dict[str, float]:
        """One update on the whole batch; with ranks, every rank calls it with the same batch and
        trains its share (orchestrator.backends.microbatch). The loss is the `algo.loss_agg_mode`
        aggregate over the whole batch however the batch is split: each part's aggregate is
        weighted by its share of the batch's units (`agg_units`: loss-masked tokens, or sequences
        with one)."""
        offsets = np.asarray(batch.offsets, dtype=np.int64)
        masked = np.asarray(batch.loss_mask, dtype=bool).copy()
        masked[offsets[:-1][np.diff(offsets) > 0]] = False   # a first token has no predicting position
        cum = np.concatenate([[0], np.cumsum(masked)])
        per_seq = cum[offsets[1:]] - cum[offsets[:-1]]        # loss-masked tokens per sequence
        n_tok = int(per_seq.sum())
        base = {"loss": 0.0, "clip_frac": 0.0, "imp_weight_mean": 1.0, "behav_capped_frac": 0.0,
                "approx_kl": 0.0, "grad_norm": 0.0, "tokens": float(n_tok),
                "sequences": float(batch.n), "skipped": 1.0, "steps": float(self.steps)}
        coef = self.cfg.entropy_coef
        signal = bool((np.asarray(batch.advantages)[per_seq > 0] != 0).any())
        if n_tok == 0 or (coef == 0 and not signal and self.ref is None):   # alike on every rank
            return base

        algo, mode = self.algo, self.algo.loss_agg_mode
        width = int(per_seq.max())
        units = agg_units(torch.arange(width)[None, :] < torch.from_numpy(per_seq)[:, None], mode)
        mine = plan(np.diff(offsets), self.world, self.cfg.micro_batch_tokens,
                    self.cfg.pack_sequences)[self.rank]
        parts = [self._tensors(batch, rows) for rows in mine]
        rows = [_sequence_rows(t) for t in parts]            # [k, L] views, one row per sequence
        weights = [agg_units(r(t["mask"]), mode) / units for r, t in zip(rows, parts)]
        shares = [float(t["mask"].sum()) / n_tok for t in parts]   # token shares, for token stats
        behav = [t["behav"] for t in parts]
        prox: list[Optional[torch.Tensor]] = [None] * len(parts)
        mismatch: dict[str, float] = {}
        if self.cfg.recompute_logprob:
            self.model.eval()
            diff_sum, diff_n, diff_max = 0.0, 0.0, 0.0
            with torch.no_grad():
                for m, t in enumerate(parts):
                    prox[m] = token_logprobs(self.model, t, self.temperature)
                    same = t["mask"] & (t["vers"] == batch.version)   # sampled by these weights
                    if bool(same.any()):
                        diff = (prox[m] - t["behav"]).abs()[same]
                        diff_sum += float(diff.sum())
                        diff_n += float(same.sum())
                        diff_max = max(diff_max, float(diff.max()))
            self._forward_done()
            diff_sum, diff_n = self._reduce([diff_sum, diff_n])
            diff_max, = self._reduce([diff_max], "max")
            if diff_n:
                mismatch = {"logprob_diff_mean": diff_sum / diff_n, "logprob_diff_max": diff_max,
                            "logprob_diff_tokens": diff_n}
        # the ratio's anchor: the recomputed (proximal) policy when recomputing (AReaL's choice
        # for the standard clip too), else the behaviour policy
        anchor = prox if self.cfg.recompute_logprob else behav
        correction = self._correction()
        token_w: list[Optional[torch.Tensor]] = [None] * len(parts)
        fixed = {"imp_weight_mean": 1.0, "behav_capped_frac": 0.0}
        if correction is not None:
            sums = [0.0, 0.0]
            for m, t in enumerate(parts):
                w, _, st = rollout_correction(rows[m](prox[m]), rows[m](behav[m]),
                                              rows[m](t["mask"]), *correction[:2],
                                              threshold=correction[2], threshold_low=correction[3])
                token_w[m] = w
                sums[0] += st["weight_mean"] * shares[m]
                sums[1] += st["hit_frac"] * shares[m]
            fixed = dict(zip(("imp_weight_mean", "behav_capped_frac"), self._reduce(sums)))

        ref_lp = self._ref_logprobs(parts) if self.ref is not None else None
        lr = self.lr_at(batch.ident)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        self.model.train()
        clip_high = self.cfg.eps_clip_higher if self.cfg.eps_clip_higher is not None else self.cfg.eps_clip
        totals: dict[str, float] = {}
        kl_first: dict[str, float] = {}
        for epoch in range(self.cfg.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            for m, t in enumerate(parts):
                r = rows[m]
                with self._sync_grads(m == len(parts) - 1):
                    lp, ent = token_logprobs(self.model, t, self.temperature, True)
                    loss, stats = policy_loss(algo.policy_loss, r(lp), r(anchor[m]), r(t["adv"]),
                                              r(t["mask"]), clip_low=self.cfg.eps_clip,
                                              clip_high=clip_high, clip_c=self.cfg.c_clip, agg=mode,
                                              horizon=algo.loss_horizon, weights=token_w[m])
                    entropy = agg_loss(r(ent), r(t["mask"]), mode, algo.loss_horizon)
                    if coef:
                        loss = loss - coef * entropy   # keeps exploring once groups stop disagreeing
                    if ref_lp is not None:
                        mask = r(t["mask"])
                        kl = kl_penalty(r(lp), r(ref_lp[m]), algo.kl_estimator)
                        kl_loss = agg_loss(kl, mask, mode, algo.loss_horizon)
                        loss = loss + self.cfg.kl_ctl * kl_loss
                        stats["kl_ref_loss"] = float(kl_loss.detach())
                        stats["kl_ref_mean"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
                    # ranks' gradients are averaged: x world makes the sum over ranks the batch loss
                    (loss * (weights[m] * self.world)).backward()
                stats["entropy"] = float(entropy.detach())
                for k, v in stats.items():      # the aggregates by units, token statistics by tokens
                    sums[k] = sums.get(k, 0.0) + v * (weights[m] if k in AGGREGATES else shares[m])
            keys = sorted(sums)
            sums = dict(zip(keys, self._reduce([sums[k] for k in keys])))
            gn = torch.nn.utils.clip_grad_norm_(self.trained, self.cfg.max_grad_norm)
            self.optimizer.step()
            sums["grad_norm"] = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
            if epoch == 0 and "kl_ref_mean" in sums:     # the policy before this step's update
                kl_first["kl_ref_mean"] = sums.pop("kl_ref_mean")
            sums.pop("kl_ref_mean", None)
            for k, v in sums.items():
                totals[k] = totals.get(k, 0.0) + v
        self.model.eval()
        self.steps += 1
        out = {k: v / self.cfg.ppo_epochs for k, v in totals.items()}
        out.update(fixed, tokens=float(n_tok), sequences=float(batch.n), skipped=0.0,
                   steps=float(self.steps), lr=lr * self.optimizer.param_groups[-1]["lr_scale"],
                   **mismatch, **kl_first)
        return out

    def _correction(self) -> Optional[tuple]:
        """(mode, level, threshold, threshold_low) of the per-token weight against the behaviour
        policy, or None: AReaL's decoupled objective is `mis` at `token` level with [0, cap]
        (no cap: every weight kept); otherwise `algo.rollout_correction`."""
        if self.cfg.use_decoupled_loss:
            cap = self.cfg.behav_imp_weight_cap
            return ("mis", "token", math.inf if cap is None else cap, None)
        a = self.algo
        if a.rollout_correction == "none":
            return None
        if not self.cfg.recompute_logprob:
            raise ValueError("algo.rollout_correction needs actor.recompute_logprob")
        return (a.rollout_correction, a.correction_level, a.correction_threshold,
                a.correction_threshold_low)

    def _reduce(self, values: list[float], op: str = "sum") -> list[float]:
        return self.group.reduce(values, op) if self.group is not None else values

    def gradients(self) -> dict[str, torch.Tensor]:
        """The full gradient of every parameter on CPU (a collective with ranks): what the last
        update applied, after clipping. For equivalence checks across splits."""
        out = {}
        for name, p in self.module.named_parameters():
            g = p.grad
            if g is not None and hasattr(g, "full_tensor"):
                g = g.full_tensor()
            out[name] = g.detach().float().cpu() if g is not None else None
        return out

    # ------------------------------------------------------------------ weights
    def weight_nbytes(self) -> int:
        return self.layout.nbytes

    def _merged(self, gather: bool):
        """With LoRA, the base + B x A weights to publish under the base's names; else None."""
        if self.peft is None:
            return None
        from orchestrator.backends.lora import MergedSource
        return MergedSource(self.module, self.layout, gather)

    def write_adapters(self, out) -> None:
        """The adapter-only publish (LoRA): the adapters gathered onto rank 0 (every rank joins;
        under fsdp on CPU one collective, `lora.gathered_adapters`), written by rank 0 alone into
        `out` (a flat buffer of `adapter_layout`: bytes-like, or a uint8 tensor; other ranks'
        `out` is not written)."""
        from orchestrator.backends.lora import gathered_adapters, write_flat_adapter

        tensors = gathered_adapters(self.peft)
        if self.rank == 0:
            write_flat_adapter(tensors, self.adapter_layout, out)

    def write_weights(self, out: memoryview) -> None:
        """This rank's part of the flat weights (sharding.shard_writes): all of them on one rank.
        With LoRA the merged weights, in the base model's layout; adapter-only, the adapters."""
        if self.adapter_only:
            return self.write_adapters(out)
        writes = sharding.shard_writes(self.model, self.layout, self.rank, self.world, self.strategy,
                                       self._merged(gather=False))
        sharding.write_shards(writes, flat_views(out, self.layout.nbytes))

    def write_weights_tensor(self, out: Optional[torch.Tensor]) -> None:
        """CUDA IPC path: the full flat weights into rank 0's uint8 buffer on its device; with
        ranks every rank calls it (parameters are gathered) and the others pass None."""
        if self.adapter_only:
            return self.write_adapters(out)
        write_flat_tensor(self.module, out, self.layout, self._merged(gather=True))


    def close(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.group is not None:
            self.group.close()

