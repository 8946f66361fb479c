"""Trainer worker process: one batch in -> one optimizer step -> weights published -> StepDone.

Main loop: poll the control ring (SaveCheckpoint / LoadCheckpoint / Shutdown) -> take one batch
from the batch ring -> train -> publish the new weights into the shm WeightBuffer with version
`batch.version + 1` (on GPU: a CUDA IPC handle of a GPU buffer kept alive until ReleaseWeights)
-> report StepDone -> check the parent. The supervisor's ship hold guarantees
at most one batch is outstanding, so the version a batch is trained at is exactly `batch.version`.
"""
from __future__ import annotations

import os
import time

from orchestrator import messages
from orchestrator.channels import recv
from orchestrator.config import Config
from orchestrator.worker_base import WorkerContext, WorkerSpec, worker_entry

BATCH_WAIT_S = 0.05


def _main(spec: WorkerSpec, ctx: WorkerContext) -> None:
    from shm.codec import decode
    from shm.ring import Ring
    from shm.weights import WeightBuffer
    from orchestrator.backends.factory import build_trainer

    cfg = Config.model_validate(spec.config)
    backend = build_trainer(cfg)
    nbytes = backend.weight_nbytes()
    control = Ring.attach(spec.names.req("trainer", 0))
    batches = Ring.attach(spec.names.batches)
    wbuf = WeightBuffer.attach(spec.names.weights)

    ipc = None
    if cfg.gpu_weights:
        from shm.cuda_ipc import CudaIpcPublisher
        ipc = CudaIpcPublisher(backend.device)

    def publish(version: int) -> float:
        if ipc is not None:      # weights stay on the GPU; the shm buffer carries the IPC handle
            wbuf.publish(ipc.publish(version, nbytes, backend.write_weights_tensor), version)
        elif nbytes:
            wbuf.publish_from(backend.write_weights, nbytes, version)
        return time.time()

    ctx.send(messages.Ready(role="trainer", index=0, pid=os.getpid(), weight_nbytes=nbytes))
    try:
        while True:
            msg = recv(control, timeout=0.0)
            while msg is not None:
                ctx.beat()
                if isinstance(msg, messages.SaveCheckpoint):
                    backend.save(msg.directory)
                    ctx.send(messages.CheckpointSaved(step=msg.step, directory=msg.directory))
                elif isinstance(msg, messages.LoadCheckpoint):
                    backend.load(msg.directory)
                    publish(msg.version)
                    ctx.send(messages.CheckpointSaved(step=-1, directory=msg.directory))
                elif isinstance(msg, messages.ReleaseWeights):
                    if ipc is not None:
                        ipc.release_below(msg.version)
                elif isinstance(msg, messages.Shutdown):
                    return
                msg = recv(control, timeout=0.0)
            try:
                raw = batches.get(timeout=BATCH_WAIT_S)
            except TimeoutError:
                ctx.check_parent()
                continue
            batch = decode(raw)
            t0 = time.monotonic()
            stats = backend.train_step(batch)
            train_s = time.monotonic() - t0
            version = batch.version + 1
            when = publish(version)
            ctx.send(messages.StepDone(step=batch.ident, version=version, publish_time=when,
                                       train_s=train_s, stats={k: float(v) for k, v in stats.items()}))
            ctx.check_parent()
    finally:
        backend.close()
        for r in (control, batches):
            r.close()
        wbuf.close()


def main(spec: WorkerSpec) -> None:
    worker_entry(spec, _main)
