"""Resume recovery: the handshake that brings a resumed run to its checkpoint's version before any admission.

`recover(res, loop, k, checkpoint_dir, state, timeout_s, check_stop, check_procs)`, on the main
thread after every worker is ready: trainer rank 0 loads `checkpoint_dir/trainer` and publishes
version k (it answers `CheckpointSaved(step=-1)`); every inference worker loads version k (it
answers `WeightsLoaded`); the shared version becomes k; the gate is aligned
(`on_version_recovered(k)`, AReaL's recovery adjustment) and only then does the event loop take back
the finished rollouts the checkpoint saved (`EventLoop.reuse_rollouts`). A `resume` event line
records what was reused and what is regenerated. Every wait is bounded by `timeout_s`
(run.startup_timeout_s); a stop signal (`check_stop`), a worker's `Fatal` or death (`check_procs`)
ends it with an error naming the phase.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable

from orchestrator import messages
from orchestrator.errors import RunFailed
from orchestrator.wire import recv, send

log = logging.getLogger("orchestrator.runtime.resume")


def await_reply(ring, kind, accept, what: str, timeout_s: float, check_stop: Callable[[str], None],
                check_procs: Callable[..., None]):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check_stop(what)
        msg = recv(ring, 0.05)
        if isinstance(msg, messages.Fatal):   # a checkpoint this config cannot serve is bad input
            code = 2 if msg.error.startswith(("ValueError", "ConfigError")) else 1
            raise RunFailed(f"{msg.role} worker {msg.index} failed during {what}: {msg.error}", code)
        if isinstance(msg, kind) and accept(msg):
            return msg
        check_procs(startup=True)
    raise RunFailed(f"timed out during {what}")


def recover(res, loop, k: int, checkpoint_dir: str, state: dict, timeout_s: float,
            check_stop: Callable[[str], None], check_procs: Callable[..., None]) -> None:
    send(res.trainer_req, messages.LoadCheckpoint(directory=os.path.join(checkpoint_dir, "trainer"),
                                                  version=k))
    await_reply(res.trainer_ctl, messages.CheckpointSaved, lambda m: m.step == -1, "checkpoint load",
                timeout_s, check_stop, check_procs)
    log.info("resume: inference workers reloading weights of version %d", k)
    for ring in res.inference_req:
        send(ring, messages.LoadWeights(version=k))
    for ring in res.inference_ctl:
        await_reply(ring, messages.WeightsLoaded, lambda m: m.version >= k, "weight reload",
                    timeout_s, check_stop, check_procs)
    res.counter.set(k)
    loop.gate.on_version_recovered(k)
    loop.reuse_rollouts(checkpoint_dir, state)
    loop.metrics.write("event", event="resume", step=k, reused=loop.reused,
                       redo=len(loop.cursor.redo), cursor=loop.cursor.cursor)
    log.info("resumed at step %d", k)
