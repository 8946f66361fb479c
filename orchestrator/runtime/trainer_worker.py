"""Trainer worker process (one per rank): one batch in -> one optimizer step -> weights published.

Rank 0 leads: it polls its control ring (SaveCheckpoint / LoadCheckpoint / ReleaseWeights /
Shutdown) and the batch ring, and turns each into one command. With several ranks
(`actor.devices` / `actor.num_ranks`) it broadcasts the command first (`RankGroup.command`) and every
rank runs it together: a batch trains on every rank's share, then every rank writes its shards of
the new weights into the slot being published (`publish_together`: rank 0 opens the slot and
switches the version after a barrier); a save
or load is a collective checkpoint. Rank 0 alone reports (StepDone, CheckpointSaved). While no
batch comes, rank 0 broadcasts a tick every `BATCH_WAIT_S` so every rank's heartbeat moves: a rank
that is stopped or hung goes silent and the supervisor's progress deadline fails the run.
Weights are published with version `batch.version + 1` (on GPU: a CUDA IPC handle of a GPU buffer
on rank 0, kept alive until ReleaseWeights); a LoRA run's StepDone stats carry the bytes published
and the seconds it took (`publish_bytes`, `publish_s`: the step line's `train_publish_*`; merged
weights, or the adapters alone with inference.vllm.lora). Checkpoints are off the critical path where the backend
can snapshot (torch, one rank or several; sim): SaveCheckpoint copies the state and a
`BackgroundSave` thread writes it while the next batches train; CheckpointSaved follows when it is
on disk (the supervisor commits then). With ranks every rank copies its shards and writes them in
its own thread (DCP's collectives on a group of their own); rank 0's write ends once every rank's
part is written, and rank 0 alone reports it. The control ring is read again after a batch is
taken, so a save sent before a batch always sees the state of its own step. The ship hold
guarantees at most one batch is outstanding, so the version a batch is trained at is exactly
`batch.version`.
"""
from __future__ import annotations

import os
import time
from collections import deque

from orchestrator import messages
from orchestrator.runtime.background_save import BackgroundSave
from orchestrator.wire import recv
from orchestrator.config import Config
from orchestrator.runtime.worker_base import WorkerContext, WorkerSpec, worker_entry

BATCH_WAIT_S = 0.05
TICK, BATCH, CONTROL, SHUTDOWN = 0, 1, 2, 3


def publish_together(wbuf, write, group, nbytes: int, version: int) -> None:
    """Every rank: `write(view)` its part of the flat weights of `version` into the weight buffer
    (shm.weights); rank 0 opens the slot, and switches to it once every rank's part is in."""
    if group is not None and not group.leader:
        view = wbuf.next_slot_view(nbytes)
        group.barrier()               # rank 0 has marked the slot as being written
        write(view)
        group.barrier()
        view.release()
        return

    def fill(view) -> None:
        if group is not None:
            group.barrier()
        write(view)
        if group is not None:
            group.barrier()           # every rank's shards are in: rank 0 switches the version

    wbuf.publish_from(fill, nbytes, version)


def _main(spec: WorkerSpec, ctx: WorkerContext) -> None:
    from shm.codec import decode
    from shm.ring import Ring
    from shm.weights import WeightBuffer
    from orchestrator.backends.factory import build_trainer

    cfg = Config.model_validate(spec.config)
    backend = build_trainer(cfg)
    group = getattr(backend, "group", None)
    leader = group is None or group.leader
    nbytes = backend.weight_nbytes()
    control = Ring.attach(spec.names.req("trainer", 0)) if leader else None
    batches = Ring.attach(spec.names.batches) if leader else None
    wbuf = WeightBuffer.attach(spec.names.weights)

    ipc = None
    if cfg.gpu_weights and leader:
        from shm.cuda_ipc import CudaIpcPublisher
        ipc = CudaIpcPublisher(backend.device)

    def publish(version: int) -> float:
        """Every rank: the weights of `version` into the shared buffer (or rank 0's GPU buffer)."""
        if cfg.gpu_weights:      # weights stay on the GPU; the shm buffer carries the IPC handle
            if ipc is None:
                backend.write_weights_tensor(None)        # a rank's part of the gather
            else:
                wbuf.publish(ipc.publish(version, nbytes, backend.write_weights_tensor), version)
        elif nbytes:
            publish_together(wbuf, backend.write_weights, group, nbytes, version)
        return time.time()

    queued: deque = deque()          # rank 0: commands taken but not run yet, in order

    def control_commands() -> None:
        while (msg := recv(control, timeout=0.0)) is not None:
            ctx.beat()
            if isinstance(msg, messages.ReleaseWeights):
                if ipc is not None:
                    ipc.release_below(msg.version)
                continue
            queued.append(((SHUTDOWN if isinstance(msg, messages.Shutdown) else CONTROL),
                           messages.encode(msg)))

    def next_command() -> tuple[int, bytes]:
        """Rank 0: the next thing to do, from the control ring first, then the batch ring. A
        SaveCheckpoint is sent before the next batch is put, so after taking a batch the control
        ring is read again: a save always sees the state of the step it names."""
        if not queued:
            control_commands()
        if not queued:
            try:
                raw = batches.get(timeout=BATCH_WAIT_S)
            except TimeoutError:
                return TICK, b""
            control_commands()
            queued.append((BATCH, raw))
        return queued.popleft()

    saves = BackgroundSave()

    def report_saves() -> None:
        for step, directory in saves.done():      # every rank reaps (a failed write raises here)
            if leader:
                ctx.send(messages.CheckpointSaved(step=step, directory=directory))

    ctx.send(messages.Ready(role="trainer", index=spec.index, pid=os.getpid(), weight_nbytes=nbytes))
    try:
        while True:
            if leader:
                kind, payload = next_command()
                if group is not None:
                    group.command(kind, payload)
            else:
                kind, payload = group.receive()
            ctx.beat()
            if kind == SHUTDOWN:
                saves.wait(ctx.beat)
                report_saves()
                if group is not None:   # no rank tears its connections down while a peer uses them
                    group.barrier()
                return
            if kind == CONTROL:
                msg = messages.decode(payload)
                if isinstance(msg, messages.SaveCheckpoint) and getattr(backend, "background_save",
                                                                        False):
                    saves.start(backend.snapshot(), msg.step, msg.directory, ctx.beat)
                elif isinstance(msg, messages.SaveCheckpoint):
                    backend.save(msg.directory)
                    if leader:
                        ctx.send(messages.CheckpointSaved(step=msg.step, directory=msg.directory))
                elif isinstance(msg, messages.LoadCheckpoint):
                    saves.wait(ctx.beat)
                    report_saves()
                    backend.load(msg.directory)
                    publish(msg.version)
                    if leader:
                        ctx.send(messages.CheckpointSaved(step=-1, directory=msg.directory))
            elif kind == BATCH:
                batch = decode(payload)
                t0 = time.monotonic()
                stats = backend.train_step(batch)
                train_s = time.monotonic() - t0
                if saves.running:           # this step trained while a checkpoint was written
                    stats["saving"] = 1.0
                version = batch.version + 1
                t1 = time.monotonic()
                when = publish(version)
                if cfg.actor.lora is not None:   # merged vs adapter-only (inference.vllm.lora)
                    stats["publish_bytes"] = float(nbytes)
                    stats["publish_s"] = time.monotonic() - t1
                if leader:
                    ctx.send(messages.StepDone(step=batch.ident, version=version, publish_time=when,
                                               train_s=train_s,
                                               stats={k: float(v) for k, v in stats.items()}))
            report_saves()
            ctx.check_parent()
    finally:
        backend.close()
        for r in (control, batches):
            if r is not None:
                r.close()
        wbuf.close()


def main(spec: WorkerSpec) -> None:
    worker_entry(spec, _main, hard_exit=True)     # gloo's threads may abort at finalization
