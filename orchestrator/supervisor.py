"""Supervisor: owns every process, shm segment and semaphore of a run, in one place.

`Supervisor(cfg).run()` sweeps segments of dead runs, creates the run directory and every shm object
(named `arl_<run_id>_*`), spawns the trainer and inference workers (spawn start method, disjoint
devices), waits for them to report ready, runs the event thread and the metrics thread, and frees
everything in one `finally`: Shutdown message -> join -> terminate -> kill, then close and unlink
every segment. SIGINT/SIGTERM stop admission, give in-flight work a drain window, then shut down;
the process is gone within `run.shutdown_timeout_s` plus a small constant. Every wait has a timeout.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from orchestrator import messages
from orchestrator.channels import (BATCH_RING_BYTES, CTL_RING_BYTES, OUT_RING_BYTES, REQ_RING_BYTES,
                                   Bell, RunNames, recv, send)
from orchestrator.config import Config
from orchestrator.event_loop import EventLoop, RunFailed
from orchestrator.metrics import MetricsLog, MetricsThread
from orchestrator.prompts import PromptCursor, build_task
from orchestrator.worker_base import WorkerSpec

log = logging.getLogger("orchestrator.supervisor")


@dataclass
class Resources:
    names: RunNames
    bell: Optional[Bell] = None
    counter: object = None
    weights: object = None
    inference_req: list = field(default_factory=list)
    inference_out: list = field(default_factory=list)
    inference_ctl: list = field(default_factory=list)
    trainer_req: object = None
    trainer_ctl: object = None
    batches: object = None
    owned: list = field(default_factory=list)     # everything to close + unlink, in creation order


def create_resources(names: RunNames, weight_nbytes: int) -> Resources:
    from shm.counter import SharedCounter
    from shm.ring import Ring
    from shm.weights import WeightBuffer

    res = Resources(names)

    def own(obj):
        res.owned.append(obj)
        return obj

    try:
        res.bell = own(Bell.create(names.bell))
        res.counter = own(SharedCounter.create(names.version))
        res.weights = own(WeightBuffer.create(names.weights, max(weight_nbytes, 8)))
        for i in range(names.num_inference):
            res.inference_req.append(own(Ring.create(names.req("inference", i), REQ_RING_BYTES)))
            res.inference_out.append(own(Ring.create(names.out(i), OUT_RING_BYTES)))
            res.inference_ctl.append(own(Ring.create(names.ctl("inference", i), CTL_RING_BYTES)))
        res.trainer_req = own(Ring.create(names.req("trainer", 0), REQ_RING_BYTES))
        res.trainer_ctl = own(Ring.create(names.ctl("trainer", 0), CTL_RING_BYTES))
        res.batches = own(Ring.create(names.batches, BATCH_RING_BYTES))
    except BaseException:
        free_resources(res)
        raise
    return res


def free_resources(res: Resources) -> None:
    for obj in reversed(res.owned):
        for fn in ("close", "unlink"):
            try:
                getattr(obj, fn)()
            except Exception as exc:      # keep freeing the rest
                log.warning("freeing %r: %s", obj, exc)
    res.owned.clear()


class Supervisor:
    def __init__(self, cfg: Config, run_dir: str, start_step: int = 0,
                 cursor_state: Optional[dict] = None, checkpoint: Optional[str] = None,
                 on_metrics=None):
        self.cfg = cfg
        self.checkpoint = checkpoint
        self.on_metrics = on_metrics
        self.run_dir = run_dir
        self.start_step = start_step
        self.cursor_state = cursor_state
        self.procs: list[tuple[str, int, mp.Process]] = []
        self.loop: Optional[EventLoop] = None
        self._stop = threading.Event()
        self._signal: Optional[int] = None

    # ------------------------------------------------------------------ processes
    def _spawn(self, res: Resources) -> None:
        from orchestrator import inference_worker, trainer_worker
        ctx = mp.get_context("spawn")
        cfg = self.cfg
        data = cfg.model_dump(mode="json")
        devs = cfg.inference.devices
        per = max(1, len(devs) // cfg.inference.num_workers) if devs else 0
        specs = [("trainer", 0, trainer_worker.main,
                  WorkerSpec("trainer", 0, res.names, data, os.getpid(), self.run_dir,
                             devices=(cfg.actor.device,) if cfg.actor.device != "cpu" else (),
                             threads=cfg.actor.threads))]
        for i in range(cfg.inference.num_workers):
            specs.append(("inference", i, inference_worker.main,
                          WorkerSpec("inference", i, res.names, data, os.getpid(), self.run_dir,
                                     devices=tuple(devs[i * per:(i + 1) * per]),
                                     threads=cfg.inference.threads_per_worker)))
        for role, i, target, spec in specs:
            p = ctx.Process(target=target, args=(spec,), name=f"arl-{role}{i}", daemon=False)
            p.start()
            self.procs.append((role, i, p))

    def _wait_ready(self, res: Resources) -> dict:
        want = {("trainer", 0)} | {("inference", i) for i in range(self.cfg.inference.num_workers)}
        ready = {}
        deadline = time.monotonic() + self.cfg.run.startup_timeout_s
        rings = [("trainer", 0, res.trainer_ctl)] + [("inference", i, r) for i, r in enumerate(res.inference_ctl)]
        while want - ready.keys():
            if self._stop.is_set():
                raise RunFailed("interrupted during startup")
            if time.monotonic() > deadline:
                raise RunFailed(f"workers {sorted(want - ready.keys())} not ready within "
                                f"run.startup_timeout_s={self.cfg.run.startup_timeout_s}")
            for role, i, ring in rings:
                msg = recv(ring, 0.0)
                if isinstance(msg, messages.Fatal):
                    code = 2 if msg.error.startswith(("ValueError", "ConfigError")) else 1
                    raise RunFailed(f"{role} worker {i} failed at startup: {msg.error}", code)
                if isinstance(msg, messages.Ready):
                    ready[(role, i)] = msg
            self._check_procs()
            res.bell.wait(0.05)
        return ready

    def _check_procs(self) -> None:
        for role, i, p in self.procs:
            if p.exitcode is not None:
                raise RunFailed(f"{role} worker {i} (pid {p.pid}) exited with code {p.exitcode}; "
                                f"see {self.run_dir}/logs/{role}{i}.log")

    def _stop_procs(self, res: Resources, budget_s: float) -> None:
        deadline = time.monotonic() + budget_s
        for ring in res.inference_req + [res.trainer_req]:
            try:
                send(ring, messages.Shutdown(reason="run over"), timeout=0.0)
            except Exception:
                pass
        for _, _, p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()) * 0.6)
        for _, _, p in self.procs:
            if p.is_alive():
                p.terminate()
        for _, _, p in self.procs:
            p.join(max(0.1, deadline - time.monotonic()) * 0.5)
        for _, _, p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(2.0)

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum, frame) -> None:
        self._signal = signum
        self._stop.set()
        if self.loop is not None:
            self.loop.stop_requested = True

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        from shm.segments import sweep_dead

        cfg = self.cfg
        sweep_dead()
        for sub in ("checkpoints", "batches", "logs"):
            os.makedirs(os.path.join(self.run_dir, sub), exist_ok=True)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        metrics = MetricsLog(os.path.join(self.run_dir, "metrics.jsonl"), on_write=self.on_metrics)
        names = RunNames(f"{os.getpid():x}{secrets.token_hex(3)}", cfg.inference.num_workers)
        task = build_task(cfg)
        res = Resources(names)
        mthread = None
        try:
            res = create_resources(names, self._weight_nbytes())
            self._spawn(res)
            self._wait_ready(res)
            cursor = PromptCursor(task, **(self.cursor_state or {}))
            self.loop = EventLoop(cfg, self.run_dir, res, task, metrics, start_step=self.start_step,
                                  cursor=cursor, resumed=self.start_step > 0)
            self.loop.stop_requested = self._stop.is_set()
            if self.start_step:
                self._recover(res)
            mthread = MetricsThread(metrics, self.loop.snapshot, cfg.metrics.interval_s)
            mthread.start()
            return self._event_thread(res, mthread)
        finally:
            if mthread is not None:
                mthread.stop()
            self._stop_procs(res, budget_s=min(5.0, cfg.run.shutdown_timeout_s))
            free_resources(res)
            metrics.close()
            for s, h in old.items():
                signal.signal(s, h)

    def _await(self, ring, kind, accept, what: str):
        deadline = time.monotonic() + self.cfg.run.startup_timeout_s
        while time.monotonic() < deadline:
            msg = recv(ring, 0.05)
            if isinstance(msg, messages.Fatal):
                raise RunFailed(f"{msg.role} worker {msg.index} failed during {what}: {msg.error}")
            if isinstance(msg, kind) and accept(msg):
                return msg
            self._check_procs()
        raise RunFailed(f"timed out during {what}")

    def _recover(self, res: Resources) -> None:
        """Resume at step k: trainer loads and publishes version k, every inference worker loads it,
        the shared version becomes k and the gate is aligned before any admission."""
        k = self.start_step
        send(res.trainer_req, messages.LoadCheckpoint(
            directory=os.path.join(self.checkpoint, "trainer"), version=k))
        self._await(res.trainer_ctl, messages.CheckpointSaved, lambda m: m.step == -1,
                    "checkpoint load")
        for i, ring in enumerate(res.inference_req):
            send(ring, messages.LoadWeights(version=k))
        for i, ring in enumerate(res.inference_ctl):
            self._await(ring, messages.WeightsLoaded, lambda m: m.version >= k, "weight reload")
        res.counter.set(k)
        self.loop.gate.on_version_recovered(k)
        log.info("resumed at step %d", k)

    def _weight_nbytes(self) -> int:
        if self.cfg.actor.backend == "sim":
            return self.cfg.actor.sim.weight_bytes
        from orchestrator.model import weight_nbytes_for
        return weight_nbytes_for(self.cfg)

    def _event_thread(self, res: Resources, mthread: MetricsThread) -> int:
        """Run the event loop in its own thread; the main thread handles signals and deadlines."""
        box: dict = {}
        loop = self.loop

        def body():
            try:
                last_check = 0.0
                while not loop.iterate():
                    now = time.monotonic()
                    if now - last_check > 0.1:
                        self._check_procs()
                        last_check = now
                    if mthread.error is not None:
                        raise mthread.error
                    if loop.stop_requested and self._drained(loop):
                        box["stopped"] = True
                        return
                box["ok"] = True
            except BaseException as exc:      # stored; re-raised on the main thread
                box["error"] = exc

        t = threading.Thread(target=body, name="event", daemon=True)
        t.start()
        stop_deadline = None
        while t.is_alive():
            t.join(0.1)
            if self._stop.is_set() and stop_deadline is None:
                stop_deadline = time.monotonic() + self.cfg.run.shutdown_timeout_s * 0.5
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                break            # drain window over: the finally clause terminates workers
        if "error" in box:
            raise box["error"]
        if self._signal is not None:
            return 128 + self._signal if "ok" not in box else 0
        return 0

    @staticmethod
    def _drained(loop: EventLoop) -> bool:
        """Drain after a stop request: nothing in flight, trainer idle, no checkpoint pending."""
        return (not loop.dispatcher.inflight and loop.outstanding is None and not loop.pending_ckpt
                and loop.watcher.target is None)
