"""Supervisor: owns every process, shm segment and semaphore of a run, in one place.

`Supervisor(cfg, run_dir).run()` sweeps segments of dead runs, creates every shm object (named
`arl_<run_id>_*`, `orchestrator.runtime.resources`), spawns the trainer ranks (`actor.devices` /
`actor.num_ranks`; a free rendezvous port and the torch.distributed environment, no torchrun) and
the inference workers (disjoint devices; every worker is forked by the run's fork server,
`orchestrator.runtime.forkserver`, which imported their modules once; with `placement.mode: ray` the
inference workers are hosted by Ray actors instead, `orchestrator.runtime.ray_cluster`, whose
placement is reserved before any worker starts), waits for them to report ready,
recovers from a checkpoint if resuming (`orchestrator.runtime.resume`), runs the event thread and
the metrics thread (every metrics line also goes to the configured sinks,
`orchestrator.observe.sinks`), and frees everything in one `finally`: Shutdown message -> join ->
SIGKILL (workers ignore SIGTERM; `orchestrator.runtime.shutdown` bounds it), then close and unlink
every segment and remove the run's scratch directory (`orchestrator.runtime.scratch`: workers'
temporary files). A dead inference worker is restarted
on fresh rings (its prompts re-dispatched by the event loop) or fails the run, per
`inference.on_worker_death`; a dead trainer fails the run. SIGINT/SIGTERM stop admission and open a
drain window (half of `run.shutdown_timeout_s`: in-flight work finishes, complete batches train, a
checkpoint is taken); then workers are told to shut down and killed, all within
`run.shutdown_timeout_s` plus a small constant.
Processes are only ever started from the main thread; workers die with the fork server (PR_SET_PDEATHSIG),
which dies with the supervisor. Every wait has a timeout (the fork server's imports: within
`run.startup_timeout_s`, with the stop checks).

Liveness (`orchestrator.runtime.liveness`): every worker stamps its progress word (monotonic ms) on each
main-loop turn and its liveness word from a thread of its own; a ready worker whose progress is
older than its role's `heartbeat_timeout_s` (a step that never ends) or whose liveness is older than
its role's `liveness_timeout_s` (SIGSTOP: the whole process frozen, noticed within seconds however
long a step may take) is killed: a hung inference worker is then handled like a dead one (prompts
re-dispatched, restart), a hung trainer fails the run naming it (exit 1, last checkpoint valid).
Trainer ranks fail together (a rank's death breaks the others' collectives): the run names the
cause (`_ranks_failed`, `_ranks_hung`) and every rank is killed, so none is left waiting on a
collective. Signals come through
`orchestrator.runtime.signals.StopSignals` (installed by launch before anything else): a signal during
startup or resume recovery stops at the next check with exit 128+signal; workers ignore SIGINT and
SIGTERM, so one sent to the whole process group drains like one sent to the supervisor.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing as mp
import os
import queue
import secrets
import signal
import threading
import time
from collections import deque
from typing import Optional

from orchestrator import messages
from orchestrator.runtime import liveness, rank_failures, resume, scratch, shutdown
from orchestrator.runtime.forkserver import Spawner
from orchestrator.runtime.placement import worker_spec
from orchestrator.wire import recv
from orchestrator.runtime.resources import (Resources, RunNames, create_resources, free_resources, ring_sizes,
                                            weight_nbytes)
from orchestrator.config import Config
from orchestrator.run.durable import atomic_write
from orchestrator.errors import ENV_HUNG_EXIT, Interrupted, RunFailed, WorkerFatal, worker_name
from orchestrator.loop.event_loop import EventLoop
from orchestrator.observe.metrics import MetricsLog, MetricsThread
from orchestrator.data.workload import build_task
from orchestrator.loop.prompts import PromptCursor
from orchestrator.loop.quarantine import quarantine_for
from orchestrator.observe.sinks import MetricSinks
from orchestrator.runtime.worker_base import WorkerSpec

log = logging.getLogger("orchestrator.runtime.supervisor")
SINKS_CLOSE_S = 10.0        # at most this long (and never past the shutdown deadline) to flush sinks


class Supervisor:
    def __init__(self, cfg: Config, run_dir: str, start_step: int = 0,
                 cursor_state: Optional[dict] = None, checkpoint: Optional[str] = None,
                 checkpoint_state: Optional[dict] = None, stop=None, on_metrics=None, task=None):
        from orchestrator.runtime.signals import StopSignals
        self.cfg = cfg
        self.run_dir = run_dir
        self.start_step = start_step
        self.cursor_state = cursor_state
        self.checkpoint = checkpoint
        self.checkpoint_state = checkpoint_state
        self.signals = stop if stop is not None else StopSignals()
        self.on_metrics = on_metrics
        self.task = task              # the prompt set (data.workload.build_task), built here when None
        self.procs: dict[tuple[str, int], mp.Process] = {}
        self.gens: dict[int, int] = {}
        self.restarts = 0
        self.restart_times: deque = deque()      # when each restart within the window happened
        self.loop: Optional[EventLoop] = None
        self._stop = self.signals.event
        self._hung: dict[tuple[str, int], liveness.Overdue] = {}   # killed for silence: key -> why
        self._rank_hang = ""          # trainer ranks killed for silence: what the run reports
        self._respawn: "queue.Queue[WorkerSpec]" = queue.Queue()
        self.scratch = ""             # per-run temporary directory (orchestrator.runtime.scratch)
        self.prompt_tokens = 0        # longest prompt of the task (workers size contexts by it)
        self.rendezvous_port = 0      # trainer ranks' process group (free_port, once per launch)
        self.spawner = Spawner(cfg)   # the run's fork server: every worker is forked by it
        self.cluster = None           # placement.mode=ray: the Ray cluster hosting inference workers

    # ------------------------------------------------------------------ processes
    def _spec(self, res: Resources, role: str, i: int, gen: int = 0) -> WorkerSpec:
        return worker_spec(self.cfg, res.names, role, i, self.run_dir, self.scratch,
                           self.rendezvous_port, gen, self.start_step, self.prompt_tokens)

    def _start(self, spec: WorkerSpec) -> None:
        from orchestrator.runtime import inference_worker, trainer_worker
        assert threading.current_thread() is threading.main_thread()
        target = trainer_worker.main if spec.role == "trainer" else inference_worker.main
        # forked by the run's fork server (its parent, which it dies with), ignoring SIGINT and
        # SIGTERM from its first instant: a signal to the process group is the supervisor's
        if self.cluster is not None and spec.role == "inference":
            p = self.cluster.start(spec)         # hosted by a Ray actor on the bundle's node
        else:
            spec = dataclasses.replace(spec, parent_pid=self.spawner.start_server(self.scratch))
            p = self.spawner.process(target, (spec,), f"arl-{spec.role}{spec.index}g{spec.gen}")
            p.start()
        self.procs[(spec.role, spec.index)] = p
        pids = {f"{r}{i}": q.pid for (r, i), q in self.procs.items()}
        atomic_write(os.path.join(self.run_dir, "logs", "pids.json"), json.dumps(pids).encode(),
                     durable=False)           # for people and tests, not on the resume path

    def _wait_ready(self, res: Resources) -> None:
        rings = {("trainer", 0): res.trainer_ctl}
        rings.update({("trainer", r + 1): ring for r, ring in enumerate(res.rank_ctl)})
        rings.update({("inference", i): r for i, r in enumerate(res.inference_ctl)})
        pending = set(rings)
        deadline = time.monotonic() + self.cfg.run.startup_timeout_s
        while pending:
            self._check_stop("startup")
            if time.monotonic() > deadline:
                raise RunFailed(f"workers {sorted(pending)} not ready within "
                                f"run.startup_timeout_s={self.cfg.run.startup_timeout_s}")
            for key in list(pending):
                msg = recv(rings[key], 0.0)
                if isinstance(msg, messages.Fatal):
                    code = 2 if msg.error.startswith(("ValueError", "ConfigError")) else 1
                    raise RunFailed(f"{self._name(*key)} failed at startup: {msg.error}", code)
                if isinstance(msg, messages.Ready):
                    pending.discard(key)
            self._check_procs(startup=True)
            res.bell.wait(0.05)

    def _check_procs(self, startup: bool = False) -> None:
        """Called from the event thread: detect dead workers and decide what follows."""
        if not startup:
            self._check_heartbeats()
        dead = [(key, p) for key, p in list(self.procs.items()) if p.exitcode is not None]
        if dead and not startup:
            self.loop.drain_inputs()      # a worker that reported a Fatal fails the run with it
        if not startup and self.cfg.actor.world_size > 1 and any(r == "trainer" for (r, _), _ in dead):
            raise self._ranks_failed()
        for (role, i), p in dead:
            where = f"see {self.run_dir}/logs/{role}{i}.log"
            hung = self._hung.pop((role, i), None)
            if hung is not None and role == "trainer":
                raise RunFailed(
                    f"trainer worker {i} (pid {p.pid}) {hung.describe()}: hung or stopped, "
                    f"killed; the last checkpoint stays valid (resume with run.resume=auto); {where}")
            if role == "trainer" or startup:
                extra = "" if startup else "; the last checkpoint stays valid (resume with run.resume=auto)"
                raise RunFailed(f"{self._name(role, i)} (pid {p.pid}) died with exit code "
                                f"{p.exitcode}{extra}; {where}")
            if getattr(p, "error", ""):       # a Ray-hosted worker: e.g. its node was lost
                where = f"{p.error}; {where}"
            why = self.loop.last_hang.pop(i, None) if self.loop is not None else None
            why = why if p.exitcode == ENV_HUNG_EXIT else None     # an earlier hang is not this death
            if p.exitcode == ENV_HUNG_EXIT:
                where = f"its environment hung (task.env_on_hang=restart): {why or '?'}; {where}"
            inf, now = self.cfg.inference, time.monotonic()
            while self.restart_times and now - self.restart_times[0] > inf.restart_window_s:
                self.restart_times.popleft()        # the budget counts per window, not per run
            if inf.on_worker_death == "fail" or len(self.restart_times) >= inf.max_restarts:
                raise RunFailed(f"inference worker {i} (pid {p.pid}) died with exit code {p.exitcode} "
                                f"(restarts used {len(self.restart_times)}/{inf.max_restarts} in "
                                f"inference.restart_window_s={inf.restart_window_s:g}, "
                                f"inference.on_worker_death={inf.on_worker_death}); {where}")
            del self.procs[(role, i)]
            self.restarts += 1
            self.restart_times.append(now)
            log.warning("inference worker %d %s; restarting", i,
                        hung.describe() if hung is not None else
                        f"died (exit {p.exitcode})" + (f": its environment hung: {why}" if why else ""))
            self.loop.metrics.write("event", event="worker_restart", worker=i, exitcode=p.exitcode,
                                    restarts=self.restarts,
                                    hung_s=hung.silent_s if hung is not None else None,
                                    hung=hung.kind if hung is not None else None)
            self.loop.worker_lost(i)
            self._respawn.put(self._fresh_rings(i))

    def _name(self, role: str, i: int) -> str:
        return worker_name(role, i, self.cfg.actor.world_size)

    def _ranks_failed(self, fatal: Optional[WorkerFatal] = None) -> RunFailed:
        """Trainer ranks fail together (once one dies, the others' collectives fail): every rank's
        report or exit is waited for (`rank_failures.settle`), then the cause named (ranks killed
        for silence first, else `rank_failures.cause`)."""
        res = self.loop.res
        procs = {r: self.procs.get(("trainer", r)) for r in range(self.cfg.actor.world_size)}
        errors, dead = rank_failures.settle([res.trainer_ctl] + res.rank_ctl, procs, fatal)
        head = self._rank_hang or rank_failures.cause(errors, dead, fatal.index if fatal else None)
        return RunFailed(f"{head}; the last checkpoint stays valid (resume with run.resume=auto); "
                         f"see {self.run_dir}/logs/trainer<rank>.log")

    def _check_heartbeats(self) -> None:
        """Kill a ready worker past its progress or liveness deadline (`liveness.overdue`);
        `_check_procs` then handles it as dead."""
        a, inf = self.cfg.actor, self.cfg.inference
        limits = {role: {"progress": (f"{sec}.heartbeat_timeout_s", c.heartbeat_timeout_s),
                         "liveness": (f"{sec}.liveness_timeout_s", c.liveness_timeout_s)}
                  for role, sec, c in (("trainer", "actor", a), ("inference", "inference", inf))}
        over = liveness.overdue(self.procs, self.loop.res.heartbeats, self.loop.res.liveness, limits)
        ranks = [k for k in over if k[0] == "trainer"]
        if ranks and self.cfg.actor.world_size > 1:
            self._ranks_hung({k: over.pop(k) for k in ranks})
        for key, why in over.items():
            p = self.procs[key]
            log.error("%s worker %d (pid %s) %s: killing it", key[0], key[1], p.pid, why.describe())
            self._hung[key] = why
            p.kill()
            p.join(2.0)

    def _ranks_hung(self, silent: dict) -> None:
        """Trainer ranks went silent (key -> `liveness.Overdue`): named, and every rank killed."""
        ranks = {r: p for (role, r), p in self.procs.items() if role == "trainer"}
        self._rank_hang = rank_failures.kill_hung(ranks, {k[1]: v for k, v in silent.items()})
        log.error("%s", self._rank_hang)

    def _fresh_rings(self, i: int) -> WorkerSpec:
        """Event thread: give worker i fresh rings (the old ones may hold a torn record) and return
        the spec the main thread spawns it with."""
        res = self.loop.res
        gen = self.gens.get(i, 0) + 1
        self.gens[i] = gen
        old = (res.inference_req[i], res.inference_out[i], res.inference_ctl[i])
        self.loop.replace_worker_rings(i, *res.inference_rings(i, gen))
        for r in old:
            res.disown(r)
        res.fresh_words("inference", i, gen)
        return self._spec(res, "inference", i, gen)

    # ------------------------------------------------------------------ signals
    @property
    def _signal(self) -> Optional[int]:
        return self.signals.signum

    @property
    def _signal_at(self) -> Optional[float]:
        return self.signals.at

    def _on_signal(self) -> None:
        if self.loop is not None:
            self.loop.stop_requested = True

    @property
    def _phase(self) -> str:
        return "resume recovery" if self.start_step else "startup"

    def _check_stop(self, where: str) -> None:
        if self._stop.is_set():
            raise Interrupted(self._signal or signal.SIGTERM, where)

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        from shm.segments import sweep_dead

        cfg = self.cfg
        swept = sweep_dead()
        self.signals.subscribe(self._on_signal)
        sinks = MetricSinks.from_config(cfg, self.run_dir)
        hooks = [h for h in (self.on_metrics, sinks and sinks.write) if h is not None]

        def on_write(rec: dict) -> None:
            for hook in hooks:
                hook(rec)
        metrics = MetricsLog(os.path.join(self.run_dir, "metrics.jsonl"), on_write=on_write)
        if swept:
            log.info("swept %d segments of dead runs", len(swept))
        names = RunNames(f"{os.getpid()}-{secrets.token_hex(3)}", cfg.inference.num_workers)
        res = Resources(names)
        mthread = None
        try:
            scratch.sweep_dead()
            self.scratch = scratch.create(names.run_id)
            try:        # task and model files are input: a broken one is exit 2
                task = self.task if self.task is not None else build_task(cfg)
                nbytes = weight_nbytes(cfg)
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}".splitlines()[0]
                raise RunFailed(f"cannot build task.name={cfg.task.name!r} / model.path="
                                f"{cfg.model.path!r}: {why}", 2) from None
            if cfg.placement.mode == "ray":     # before anything starts: a refusal is exit 2
                from orchestrator.runtime.ray_cluster import RayCluster
                self.cluster = RayCluster(cfg, names.run_id)
                self.cluster.connect(lambda: self._check_stop("startup"))
            self._check_stop("startup")
            self.spawner.start_server(self.scratch)    # imports the workers' modules meanwhile
            self.prompt_tokens = int(task.max_prompt_tokens)
            res = create_resources(names, nbytes, ring_sizes(cfg, task.max_prompt_tokens),
                                   cfg.actor.world_size)
            for r in range(cfg.actor.world_size):
                res.fresh_words("trainer", r)
            for i in range(cfg.inference.num_workers):
                res.fresh_words("inference", i)
            if self.cluster is not None:
                self.cluster.res = res
            self._check_stop("startup")
            self.rendezvous_port = rank_failures.free_port()
            hosted = self.cluster is not None     # Ray hosts start while the fork server imports
            for i in range(cfg.inference.num_workers if hosted else 0):
                self._start(self._spec(res, "inference", i))
            try:
                waited = self.spawner.wait_ready(cfg.run.startup_timeout_s,
                                                 lambda: self._check_stop("startup"))
            except TimeoutError as exc:
                raise RunFailed(f"workers not ready within run.startup_timeout_s="
                                f"{cfg.run.startup_timeout_s}: {exc}") from None
            log.info("fork server ready (%.1f s after the resources)", waited)
            for r in range(cfg.actor.world_size):
                self._start(self._spec(res, "trainer", r))
            for i in range(0 if hosted else cfg.inference.num_workers):
                self._start(self._spec(res, "inference", i))
            self._wait_ready(res)
            state = dict(self.cursor_state or {})
            held = quarantine_for(cfg, task, state.pop("quarantine", None))   # kept across resume
            cursor = PromptCursor(task, **state, quarantine=held)
            self.loop = EventLoop(cfg, self.run_dir, res, task, metrics, start_step=self.start_step,
                                  cursor=cursor, resumed=self.start_step > 0)
            self.loop.stop_requested = self._stop.is_set()
            if self.start_step:
                self._recover(res)
            self._check_stop(self._phase)
            mthread = MetricsThread(metrics, self.loop.snapshot, cfg.metrics.interval_s)
            mthread.start()
            return self._event_thread(res, mthread)
        except RunFailed as exc:
            if self._stop.is_set() and not isinstance(exc, Interrupted) and mthread is None:
                log.warning("after the stop signal: %s", exc)   # e.g. a worker hit by the signal
                raise Interrupted(self._signal or signal.SIGTERM,
                                  self._phase) from None
            raise
        finally:
            if mthread is not None:
                mthread.stop()
            deadline = shutdown.deadline(self._signal_at, cfg.run.shutdown_timeout_s)
            shutdown.stop_processes(list(self.procs.values()), res.inference_req + [res.trainer_req],
                                    deadline)
            self.spawner.close()
            if self.cluster is not None:
                self.cluster.close(deadline)
            free_resources(res)
            if self.scratch:
                scratch.remove(self.scratch)
            metrics.close()
            if sinks is not None:        # within the shutdown bound; its thread is a daemon
                sinks.close(min(SINKS_CLOSE_S, max(1.0, deadline - time.monotonic())))

    def _recover(self, res: Resources) -> None:
        resume.recover(res, self.loop, self.start_step, self.checkpoint, self.checkpoint_state,
                       self.cfg.run.startup_timeout_s, self._check_stop, self._check_procs)

    def _event_thread(self, res: Resources, mthread: MetricsThread) -> int:
        """Run the event loop in its own thread; the main thread handles signals, restarts and
        the drain deadline."""
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
                    if loop.abort:
                        return
                    if loop.stop_requested and loop.drained():
                        return
                box["ok"] = True
            except WorkerFatal as exc:
                many = exc.role == "trainer" and self.cfg.actor.world_size > 1
                box["error"] = self._ranks_failed(exc) if many else exc
            except BaseException as exc:      # stored; re-raised on the main thread
                box["error"] = exc

        t = threading.Thread(target=body, name="event", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.05)
            while not self._respawn.empty():
                try:
                    self._start(self._respawn.get_nowait())
                except BaseException:     # e.g. no node left for it: stop the loop, then fail
                    loop.abort = True
                    t.join(1.0)
                    raise
            if self._signal_at is not None and \
                    time.monotonic() > self._signal_at + self.cfg.run.shutdown_timeout_s * 0.5:
                loop.abort = True          # drain window over
                t.join(1.0)
                break
        if "error" in box:
            raise box["error"]
        if "ok" in box:
            return 0
        return 128 + (self._signal or signal.SIGTERM)
