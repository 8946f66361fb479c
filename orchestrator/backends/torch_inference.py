"""Built-in torch inference backend: batched sampling from an HF causal LM, one decode step per call.

Contract (InferenceBackend of base.py):
- `TorchInference(model_cfg, task_cfg, rollout_cfg, inference_cfg, seed, device, sample_seed=None)`
  loads the model's tokens (`data.tokens.load_tokens`: stop ids from the generation config, pad) and
  builds the model exactly as the trainer does (`build_model(model_cfg, vocab, seed)`),
  so version 0 is the trainer's initial policy. Sampling uses its own generator seeded with
  `sample_seed` (default `seed`; give each worker a distinct one). On CPU it sets torch's intra-op
  threads to `inference_cfg.threads_per_worker` (a process-wide setting).
- `add(req)` queues a request of `req.n` rows; requests are admitted FIFO while the running rows fit
  in `inference_cfg.max_batch` (one request larger than that runs alone).
- `step(max_wait_s)` runs ONE decode step for every unfinished running row together (full recompute
  over a left-padded batch: simplest correct choice for tiny models and short sequences), samples
  each next token from softmax(logits / temperature) (a request with a `key`, run.deterministic:
  row j from its own generator keyed by key + (j,), one uniform draw per token against the float64
  CDF, so its tokens depend on its key and its logits alone), records its logprob under that same
  distribution and stamps it with the currently loaded version. A row finishes on a stop id, on
  `req.max_new_tokens`, or at the model's `max_seq_len`. Returns the requests whose n rows are all done.
- `load_weights(version, flat)` installs weights between steps; tokens sampled afterwards carry
  `version`, so a partial rollout spans versions. On CPU the parameters live in one flat buffer in
  the trainer's layout, `weights_in_place` (a writable memoryview): the worker reads published
  weights straight into it and calls `load_weights(version, weights_in_place)`, which copies nothing.
- GenResult.sequences: n rows of prompt + completion; logprobs 0 and versions -1 on prompt tokens,
  loss_mask 1 on generated tokens (eos included), rewards/advantages 0, version = the lowest version
  that generated a token of the request (the head), ident = request_id, kind 1 for eval else 0.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from orchestrator.backends.base import GenRequest, GenResult
from orchestrator.data.tokens import load_tokens
from orchestrator.backends.model import (bind_flat, build_model, flat_layout, load_flat, load_flat_tensor,
                                resolve_device)
from shm.codec import Sequences

KIND_TRAIN, KIND_EVAL = 0, 1  # Sequences.kind of a result (the inference worker's convention)


@dataclass
class Row:
    """One sample being generated (shared with the vllm backend)."""
    tokens: list[int]
    prompt_len: int
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    done: bool = False
    rng: Optional[np.random.Generator] = None     # keyed request (run.deterministic): its own draws


@dataclass
class Active:
    req: GenRequest
    rows: list[Row]


def check_request(req: GenRequest, max_seq_len: int, active: bool) -> None:
    """What every model backend refuses (shared with the vllm backend)."""
    plen = int(len(req.prompt_tokens))
    if plen == 0 or plen >= max_seq_len:
        raise ValueError(f"prompt of {plen} tokens does not fit max_seq_len {max_seq_len}")
    if req.n < 1 or req.max_new_tokens < 1 or req.temperature <= 0:
        raise ValueError(f"request {req.request_id}: n, max_new_tokens and temperature must be > 0")
    if active:
        raise ValueError(f"request {req.request_id} is already active")


def build_sequences(request_id: int, prompt_id: int, rows: list[Row], kind: int = KIND_TRAIN) -> Sequences:
    """Columnar record for one request's rows (the layout described in the module docstring)."""
    n = len(rows)
    lens = np.array([len(r.tokens) for r in rows], dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    tokens = np.empty(total, dtype=np.int32)
    logprobs = np.zeros(total, dtype=np.float32)
    versions = np.full(total, -1, dtype=np.int32)
    loss_mask = np.zeros(total, dtype=np.uint8)
    for i, r in enumerate(rows):
        a, p = int(offsets[i]), r.prompt_len
        tokens[a:a + len(r.tokens)] = r.tokens
        g = len(r.logprobs)
        logprobs[a + p:a + p + g] = r.logprobs
        versions[a + p:a + p + g] = r.versions
        loss_mask[a + p:a + p + g] = 1
    gen_versions = versions[loss_mask.astype(bool)]
    head = int(gen_versions.min()) if gen_versions.size else -1
    return Sequences(
        kind=kind, ident=int(request_id), version=head, offsets=offsets,
        prompt_lens=np.array([r.prompt_len for r in rows], dtype=np.int32),
        prompt_ids=np.full(n, prompt_id, dtype=np.int64),
        tokens=tokens, logprobs=logprobs, versions=versions, loss_mask=loss_mask,
        rewards=np.zeros(n, dtype=np.float32), advantages=np.zeros(n, dtype=np.float32),
        scalars=np.zeros(0, dtype=np.float64),
    )


class TorchInference:
    def __init__(self, model_cfg, task_cfg, rollout_cfg, inference_cfg, seed: int, device="cpu",
                 sample_seed: Optional[int] = None):
        self.device = resolve_device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(inference_cfg.threads_per_worker)
        self.tokens = tokens = load_tokens(model_cfg.path)
        self.tokenizer = tokens.tokenizer
        self.stop_ids = frozenset(tokens.stop_ids)
        self.pad_id = tokens.pad_id
        self.model = build_model(model_cfg, len(self.tokenizer), seed).to(self.device).eval()
        self.layout = flat_layout(self.model)
        self.weights_in_place = bind_flat(self.model, self.layout) if self.device.type == "cpu" \
            else None
        cfg = self.model.config
        self.max_seq_len = int(getattr(cfg, "max_position_embeddings", model_cfg.max_seq_len))
        self.max_batch = int(inference_cfg.max_batch)
        self.default_temperature = float(rollout_cfg.temperature)
        self.version = 0
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(int(seed if sample_seed is None else sample_seed))
        self._waiting: deque[GenRequest] = deque()
        self._running: dict[int, Active] = {}

    # ------------------------------------------------------------------ requests
    def add(self, req: GenRequest) -> None:
        active = req.request_id in self._running or any(w.request_id == req.request_id
                                                        for w in self._waiting)
        check_request(req, self.max_seq_len, active)
        self._waiting.append(req)

    def num_active(self) -> int:
        return len(self._waiting) + len(self._running)

    def abort(self, request_id: int) -> bool:
        if self._running.pop(request_id, None) is not None:
            return True
        for w in self._waiting:
            if w.request_id == request_id:
                self._waiting.remove(w)
                return True
        return False

    def _admit(self) -> None:
        rows = sum(len(a.rows) for a in self._running.values())
        while self._waiting and (not self._running or rows + self._waiting[0].n <= self.max_batch):
            req = self._waiting.popleft()
            prompt = [int(t) for t in np.asarray(req.prompt_tokens)]
            self._running[req.request_id] = Active(req, [
                Row(list(prompt), len(prompt),
                    rng=np.random.default_rng([*req.key, j]) if req.key else None)
                for j in range(req.n)])
            rows += req.n

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def step(self, max_wait_s: float = 0.0) -> list[GenResult]:
        self._admit()
        live = [(a, r) for a in self._running.values() for r in a.rows if not r.done]
        if live:
            self._decode(live)
        finished = []
        for rid in [rid for rid, a in self._running.items() if all(r.done for r in a.rows)]:
            a = self._running.pop(rid)
            kind = KIND_EVAL if a.req.eval else KIND_TRAIN
            finished.append(GenResult(rid, build_sequences(rid, a.req.prompt_id, a.rows, kind)))
        return finished

    def _decode(self, live: list[tuple[Active, Row]]) -> None:
        lens = [len(r.tokens) for _, r in live]
        width = max(lens)
        ids = np.full((len(live), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(live), width), dtype=np.int64)
        for i, (_, r) in enumerate(live):  # left padding: the next-token logits sit at column -1
            ids[i, width - lens[i]:] = r.tokens
            mask[i, width - lens[i]:] = 1
        ids_t = torch.from_numpy(ids).to(self.device)
        mask_t = torch.from_numpy(mask).to(self.device)
        pos_t = (mask_t.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids_t, attention_mask=mask_t, position_ids=pos_t,
                            logits_to_keep=1, use_cache=False).logits[:, -1, :].float()
        temps = torch.tensor([a.req.temperature for a, _ in live], dtype=torch.float32,
                             device=self.device).unsqueeze(-1)
        logp = torch.log_softmax(logits / temps, dim=-1)
        nxt = self._sample(logp, [r.rng for _, r in live])
        lp = logp.gather(-1, nxt).squeeze(-1).cpu().numpy()
        nxt = nxt.squeeze(-1).cpu().numpy()
        for i, (a, r) in enumerate(live):
            tok = int(nxt[i])
            r.tokens.append(tok)
            r.logprobs.append(float(lp[i]))
            r.versions.append(self.version)
            if (tok in self.stop_ids or len(r.logprobs) >= a.req.max_new_tokens
                    or len(r.tokens) >= self.max_seq_len):
                r.done = True

    def _sample(self, logp: torch.Tensor, rngs: list) -> torch.Tensor:
        """Next token ids [rows, 1]: rows with a generator of their own (a keyed request) invert
        the float64 CDF of their distribution at one uniform draw each, so a row's sample depends
        on its key and its probabilities alone; the others share the worker's stream."""
        keyed = [i for i, g in enumerate(rngs) if g is not None]
        if not keyed:
            return torch.multinomial(logp.exp(), 1, generator=self._gen)
        out = torch.zeros((logp.shape[0], 1), dtype=torch.int64)
        free = [i for i, g in enumerate(rngs) if g is None]
        if free:
            out[free] = torch.multinomial(logp[free].exp(), 1, generator=self._gen).cpu()
        cdf = np.cumsum(logp[keyed].double().exp().cpu().numpy(), axis=1)
        u = np.array([rngs[i].random() for i in keyed]) * cdf[:, -1]
        picks = np.minimum((cdf < u[:, None]).sum(axis=1), cdf.shape[1] - 1)
        out[keyed, 0] = torch.from_numpy(picks.astype(np.int64))
        return out.to(logp.device)

    # ------------------------------------------------------------------ weights
    def load_weights(self, version: int, flat: memoryview) -> None:
        if flat is not self.weights_in_place:       # else the bytes were read into the weights
            load_flat(self.model, flat, self.layout)
        self.version = int(version)

    def load_weights_tensor(self, version: int, flat: "torch.Tensor") -> None:
        """CUDA IPC path: `flat` is the trainer's uint8 GPU buffer mapped into this process."""
        load_flat_tensor(self.model, flat, self.layout)
        self.version = int(version)

    def weight_nbytes(self) -> int:
        return self.layout.nbytes

    def close(self) -> None:
        self._waiting.clear()
        self._running.clear()
