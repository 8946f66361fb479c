"""Inference worker process: prompts in, rollout groups out, weight reloads between steps.

Main loop: poll the request ring (Generate / LoadWeights / Abort / Shutdown, in supervisor order)
-> one backend step -> hand finished groups to the reward pool (threads: a slow reward never stalls
decoding) -> emit the scored ones -> check the parent. A multi-turn task (`task.env`) hands each
Generate to the episode runner instead (`envs.runner`: an environment thread): its model turns are
put to the backend as one-sample requests (and aborted when their episode stops waiting for them:
an agent's client that disconnects), their results go back to it, and its finished groups are
emitted; an agent task (`task.agent`) serves its episodes' HTTP endpoint from the environment
thread. A bad reward or environment (`BadEnvOutput`) fails the run with exit 2. An environment
that hangs (`EpisodeRunner.hung`: its loop stalled, or more than `task.env_max_stuck_calls` stuck
calls), checked every turn: with `task.env_on_hang=fail` an `EnvHung` Fatal fails the run naming it
(exit 1); with `restart` the worker logs it, closes and exits with ENV_HUNG_EXIT and no Fatal, so
the supervisor handles it as a dead worker (prompts re-dispatched, restart per
`inference.on_worker_death`). Each hang of a train row (`EpisodeRunner.hang_reports`: a blocking
call abandoned past `task.env_timeout_s`, the call blocking the loop) is sent first as
`messages.EnvHung`, so the supervisor names the environment and the row and counts the row's hangs
toward its quarantine (`loop.quarantine`).
With run.deterministic a Generate may carry `hold` (more of its wave follows): the backend is not
stepped until one without it arrives, so which requests share a forward pass follows from the wave
(`loop.lockstep`); its `key` goes to the backend, whose sampling it keys. A multi-turn task's
backend is stepped only when every episode awaits a model turn or is over
(`EpisodeRunner.settled`), its turns added in key order (the group's key + (episode, turn)): the
turns sharing each forward pass then follow from the run, not from the environment's timing.
Weights are read from the run's shm WeightBuffer; the loaded version is acknowledged so the
supervisor's weight watcher can bump the shared policy version.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from orchestrator import messages
from orchestrator.backends.base import GenRequest
from orchestrator.wire import recv
from orchestrator.config import Config
from orchestrator.envs.runner import EpisodeRunner
from orchestrator.errors import ENV_HUNG_EXIT
from orchestrator.runtime.worker_base import WorkerContext, WorkerSpec, worker_entry

IDLE_WAIT_S = 0.05
PUT_TIMEOUT_S = 60.0
REWARD_POLL_S = 0.002         # how often scored groups are looked for while rewards run


class EnvHung(RuntimeError):
    """A multi-turn environment hung its worker (task.env_on_hang=fail)."""


class _Restart(Exception):
    """A multi-turn environment hung its worker (task.env_on_hang=restart)."""


def _main(spec: WorkerSpec, ctx: WorkerContext) -> None:
    from shm.codec import encode
    from shm.ring import Ring
    from shm.weights import WeightBuffer
    from orchestrator.backends.factory import build_inference

    cfg = Config.model_validate(spec.config)
    backend, scorer = build_inference(cfg, spec.index, spec.gen, spec.start_step,
                                      spec.prompt_tokens)
    episodes = scorer if isinstance(scorer, EpisodeRunner) else None
    rewards = None if episodes is not None else scorer
    if rewards is not None:
        rewards.beat = ctx.beat             # workers=0: its waits keep the heartbeat
    nbytes = backend.weight_nbytes()
    req = Ring.attach(spec.names.req("inference", spec.index, spec.gen))
    out = Ring.attach(spec.names.out(spec.index, spec.gen))
    wbuf = WeightBuffer.attach(spec.names.weights)
    in_place = getattr(backend, "weights_in_place", None)

    def load(version: int) -> int:
        """One copy from the shared buffer into the weights: straight into the backend's own flat
        buffer where it has one, else the backend loads from a view of the shared slot."""
        if cfg.gpu_weights:          # the buffer holds a CUDA IPC handle; the trainer's GPU is
            from shm.cuda_ipc import open_blob    # the last visible device of this worker
            blob = bytearray(wbuf.nbytes)
            got = wbuf.read_into(memoryview(blob), timeout=30.0)
            _, tensor = open_blob(bytes(blob), device_index=len(spec.devices) - 1)
            backend.load_weights_tensor(got, tensor)
            del tensor
            return got
        if not nbytes:
            backend.load_weights(version, memoryview(b""))
            return version
        if in_place is not None:
            got = wbuf.read_into(in_place, timeout=30.0)
            backend.load_weights(got, in_place)
            return got
        if getattr(backend, "loads_shared", False):   # ranks in other processes map the slot
            return wbuf.read_shared(lambda where, got: backend.load_weights(got, where), timeout=30.0)
        return wbuf.read_with(lambda view, got: backend.load_weights(got, view[:nbytes]),
                              timeout=30.0)

    reqs: dict[int, tuple[bool, int]] = {}        # request id -> (eval, dataset row), generating

    def requests_waiting() -> bool:
        head, tail = req.positions()
        return head != tail

    def emit(seqs) -> None:
        out.put(encode(seqs), timeout=PUT_TIMEOUT_S)
        ctx.bell.ring()
    ctx.send(messages.Ready(role="inference", index=spec.index, pid=os.getpid(),
                            weight_nbytes=nbytes))
    hang = None
    holding = False       # the last Generate said more of its wave follows: do not decode yet
    lockstep = cfg.run.deterministic
    settled = True        # lockstep, multi-turn: every episode awaits a turn or is over
    try:
        while True:
            hint = backend.wait_hint() if hasattr(backend, "wait_hint") else (
                0.0 if backend.num_active() else None)
            wait = IDLE_WAIT_S if hint is None else min(hint, IDLE_WAIT_S)
            if scorer is not None and scorer.busy():
                wait = min(wait, REWARD_POLL_S)
            if holding:                   # the rest of a deterministic wave is on its way
                wait = IDLE_WAIT_S
            elif not settled:             # a deterministic wave's episodes are between turns
                wait = REWARD_POLL_S
            msg = recv(req, timeout=wait)
            while msg is not None:
                if isinstance(msg, messages.Generate):
                    if episodes is not None:      # n episodes; their turns come back as requests
                        episodes.start(msg.request_id, msg.prompt_id, msg.row, msg.n, msg.eval,
                                       msg.temperature, tuple(msg.key))
                    else:
                        reqs[msg.request_id] = (msg.eval, msg.row)
                        backend.add(GenRequest(msg.request_id, msg.prompt_id,
                                               np.asarray(msg.prompt_tokens, dtype=np.int32), msg.n,
                                               msg.max_new_tokens, msg.temperature, msg.eval,
                                               tuple(msg.key)))
                    holding = msg.hold
                elif isinstance(msg, messages.LoadWeights):
                    ctx.beat()
                    got = load(msg.version)
                    ctx.beat()
                    ctx.send(messages.WeightsLoaded(index=spec.index, version=got))
                elif isinstance(msg, messages.Abort):      # answered, so the supervisor can forget it
                    live = msg.request_id in reqs or (episodes is not None
                                                      and episodes.running(msg.request_id))
                    backend.abort(msg.request_id)
                    reqs.pop(msg.request_id, None)
                    for key in episodes.cancel(msg.request_id) if episodes is not None else ():
                        backend.abort(key)
                    ctx.send(messages.Aborted(index=spec.index, request_id=msg.request_id,
                                              result_sent=not live))
                elif isinstance(msg, messages.Shutdown):
                    return
                msg = recv(req, timeout=0.0)
            if episodes is not None and lockstep:   # step only once every episode of the whole
                settled = not holding and episodes.settled()      # wave awaits a turn
            if episodes is not None and settled:    # model turns of running episodes
                turns = episodes.requests()
                if lockstep:                        # added in key order, not arrival order
                    turns.sort(key=lambda t: t.sample_key)
                for t in turns:
                    backend.add(GenRequest(t.key, t.prompt_id, t.ids, 1, t.max_new_tokens,
                                           t.temperature, t.eval, t.sample_key))
                for key in episodes.aborts():        # their episodes stopped waiting (a client gone)
                    backend.abort(key)
            for res in () if holding or not settled else backend.step(0.0):
                if episodes is not None:
                    episodes.turn_done(res.request_id, res.sequences)
                    continue
                is_eval, row = reqs.pop(res.request_id, (False, -1))
                seqs = res.sequences
                seqs.kind = 1 if is_eval else 0
                if rewards is None:
                    emit(seqs)
                else:
                    rewards.submit(seqs, row, is_eval)
            if rewards is not None:       # BadEnvOutput propagates: the run stops with exit 2
                idle = not backend.num_active()       # then groups finished together leave together
                for seqs in rewards.ready(IDLE_WAIT_S if idle else 0.0, until=requests_waiting):
                    emit(seqs)
            if episodes is not None:
                for seqs in episodes.ready():
                    emit(seqs)
                why = episodes.hung(cfg.task.env_max_stuck_calls)
                for row, pid, line in episodes.hang_reports():   # the supervisor counts them per row
                    ctx.send(messages.EnvHung(index=spec.index, row=row, prompt_id=pid, why=line))
                if why is not None:
                    if cfg.task.env_on_hang == "fail":
                        raise EnvHung(why)
                    raise _Restart(why)
            ctx.check_parent()
    except _Restart as exc:
        hang = str(exc)
    finally:
        if scorer is not None:
            scorer.close()
        backend.close()
        for r in (req, out):
            r.close()
        wbuf.close()
    if hang is not None:      # exit without a Fatal: a dead worker, which the supervisor restarts
        ctx.log.error("%s; exiting with code %d to be restarted (task.env_on_hang=restart)",
                      hang, ENV_HUNG_EXIT)
        logging.shutdown()
        os._exit(ENV_HUNG_EXIT)   # stuck environment threads are left behind with the process


def main(spec: WorkerSpec) -> None:
    worker_entry(spec, _main)
