"""Inference worker process: prompts in, rollout groups out, weight reloads between steps.

Main loop: poll the request ring (Generate / LoadWeights / Abort / Shutdown, in supervisor order)
-> one backend step -> emit finished groups (rewards filled by the task) -> check the parent.
Weights are read from the run's shm WeightBuffer; the loaded version is acknowledged so the
supervisor's weight watcher can bump the shared policy version.
"""
from __future__ import annotations

import math
import numbers
import os

import numpy as np

from orchestrator import messages
from orchestrator.backends.base import GenRequest
from orchestrator.channels import recv
from orchestrator.config import Config
from orchestrator.worker_base import WorkerContext, WorkerSpec, worker_entry

IDLE_WAIT_S = 0.05
PUT_TIMEOUT_S = 60.0


class BadEnvOutput(ValueError):
    pass


def _fill_rewards(seqs, task, is_eval: bool) -> None:
    """Rewards from the task. A reward function that raises, or returns anything but a finite real
    number (Python or numpy scalar; not a bool), is bad environment output (exit 2)."""
    name = getattr(task, "name", type(task).__name__)
    for i in range(seqs.n):
        sl = seqs.seq(i)
        completion = seqs.tokens[sl][seqs.prompt_lens[i]:]
        pid = int(seqs.prompt_ids[i])
        try:
            r = task.reward(pid, completion, is_eval)
        except Exception as exc:
            raise BadEnvOutput(f"reward function of task {name!r} raised for prompt {pid}: "
                               f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
        if isinstance(r, (bool, np.bool_)) or not isinstance(r, (numbers.Real, np.number)) \
                or not math.isfinite(float(r)):
            raise BadEnvOutput(f"reward function of task {name!r} returned {r!r} for prompt {pid}, "
                               f"not a finite number")
        seqs.rewards[i] = float(r)


def _main(spec: WorkerSpec, ctx: WorkerContext) -> None:
    from shm.codec import encode
    from shm.ring import Ring
    from shm.weights import WeightBuffer
    from orchestrator.backends.factory import build_inference

    cfg = Config.model_validate(spec.config)
    backend, task = build_inference(cfg, spec.index, spec.gen, spec.start_step)
    nbytes = backend.weight_nbytes()
    req = Ring.attach(spec.names.req("inference", spec.index, spec.gen))
    out = Ring.attach(spec.names.out(spec.index, spec.gen))
    wbuf = WeightBuffer.attach(spec.names.weights)
    flat = bytearray(wbuf.nbytes if cfg.gpu_weights else max(nbytes, 8))

    def load(version: int) -> int:
        if cfg.gpu_weights:          # the buffer holds a CUDA IPC handle; the trainer's GPU is
            from shm.cuda_ipc import open_blob    # the last visible device of this worker
            got = wbuf.read_into(memoryview(flat), timeout=30.0)
            _, tensor = open_blob(bytes(flat), device_index=len(spec.devices) - 1)
            backend.load_weights_tensor(got, tensor)
            del tensor
            return got
        got = wbuf.read_into(memoryview(flat), timeout=30.0) if nbytes else version
        backend.load_weights(got, memoryview(flat)[:nbytes])
        return got

    evals: dict[int, bool] = {}
    ctx.send(messages.Ready(role="inference", index=spec.index, pid=os.getpid(),
                            weight_nbytes=nbytes))
    try:
        while True:
            hint = backend.wait_hint() if hasattr(backend, "wait_hint") else (
                0.0 if backend.num_active() else None)
            wait = IDLE_WAIT_S if hint is None else min(hint, IDLE_WAIT_S)
            msg = recv(req, timeout=wait)
            while msg is not None:
                if isinstance(msg, messages.Generate):
                    evals[msg.request_id] = msg.eval
                    backend.add(GenRequest(msg.request_id, msg.prompt_id,
                                           np.asarray(msg.prompt_tokens, dtype=np.int32), msg.n,
                                           msg.max_new_tokens, msg.temperature, msg.eval))
                elif isinstance(msg, messages.LoadWeights):
                    ctx.beat()
                    got = load(msg.version)
                    ctx.beat()
                    ctx.send(messages.WeightsLoaded(index=spec.index, version=got))
                elif isinstance(msg, messages.Abort):
                    backend.abort(msg.request_id)
                    evals.pop(msg.request_id, None)
                elif isinstance(msg, messages.Shutdown):
                    return
                msg = recv(req, timeout=0.0)
            for res in backend.step(0.0):
                is_eval = evals.pop(res.request_id, False)
                seqs = res.sequences
                seqs.kind = 1 if is_eval else 0
                if task is not None:      # BadEnvOutput propagates: the run stops with exit 2
                    _fill_rewards(seqs, task, is_eval)
                out.put(encode(seqs), timeout=PUT_TIMEOUT_S)
                ctx.bell.ring()
            ctx.check_parent()
    finally:
        backend.close()
        for r in (req, out):
            r.close()
        wbuf.close()


def main(spec: WorkerSpec) -> None:
    worker_entry(spec, _main)
