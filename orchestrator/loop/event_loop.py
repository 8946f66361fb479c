"""The supervisor's event thread: gate -> dispatcher -> stamp -> sinks -> ship hold -> trainer,
with the weight watcher, drain, the empty-batch guard, eval rounds and checkpoints.

One iteration: read every worker->supervisor ring without blocking -> weight watcher -> admit while
the gate has capacity -> pump the dispatcher -> stamp finished groups and feed the sinks -> build,
persist and park full batches -> ship one when the trainer has caught up -> sleep on the doorbell if
nothing happened. Invariants kept here: admission only through `StalenessGate`; at most one batch
outstanding at the trainer (so a batch is trained at exactly `step - 1`); every batch is persisted
under `batches/` before it ships (zstd at `run.batch_compression`); a drain at `run.total_steps`; N
consecutive batches with nothing trainable stop the run. Disk stays bounded: after each checkpoint
commit, checkpoints past `run.keep_checkpoints` (`checkpoint.prune`) and, with `run.keep_batches`,
batch files older than that many steps before the committed one are deleted.
`loop.step_lines.StepLines` writes step lines in step order once a step's StepDone is in and every
inference worker has loaded its weights. With run.deterministic (`loop.lockstep.Lockstep`,
`self.det`) admission is by waves at the schedule's versions instead of the gate's capacity, a
wave's groups reach the sink in stream order, the watcher reloads and the ship hold releases where
the schedule allows, a checkpoint waits for `checkpoint_ready`; a stop's drain is free.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

from orchestrator import messages
from orchestrator.loop.checkpoints import CheckpointBook
from orchestrator.loop.loop_checkpoints import LoopCheckpoints
from orchestrator.loop.worker_events import WorkerEvents
from orchestrator.loop.step_lines import StepLines
from orchestrator.loop.age_bound import AgeBound, enforce
from orchestrator.wire import recv, send
from orchestrator.data.budgets import episode_tokens
from orchestrator.config import Config
from orchestrator.run.durable import write_record
from orchestrator.loop.dispatcher import Dispatcher
from orchestrator.errors import EmptyBatches, RunFailed, WorkerFatal, worker_name
from orchestrator.loop.eval_sink import EvalSink
from orchestrator.loop.gate import StalenessGate
from orchestrator.observe.metrics import MetricsLog
from orchestrator.loop.prompts import PromptCursor
from orchestrator.loop.lockstep import Lockstep, Wave, eval_key, pins, train_key
from orchestrator.loop.stall import StallGuard
from orchestrator.loop.train_sink import BatchInfo, TrainSink
from orchestrator.loop.validate import check_rollout
from orchestrator.loop.watcher import WeightWatcher
from shm.codec import decode, encode

log = logging.getLogger("orchestrator.loop.event_loop")
IDLE_WAIT_S = 0.05


@dataclass
class Parked:
    step: int
    record: bytearray
    info: BatchInfo
    since: float


class EventLoop(LoopCheckpoints, WorkerEvents):
    def __init__(self, cfg: Config, run_dir: str, res, task, metrics: MetricsLog,
                 start_step: int = 0, cursor: Optional[PromptCursor] = None, resumed: bool = False):
        self.cfg, self.run_dir, self.res, self.metrics = cfg, run_dir, res, metrics
        r = cfg.rollout
        self.counter = res.counter
        self.gate = StalenessGate(r.max_head_offpolicyness, r.consumer_batch_size, r.concurrency,
                                  version=self.counter.get)
        self.dispatcher = Dispatcher(res.inference_req, r.queue_size)
        self.sink = TrainSink.for_config(cfg)
        self.eval_sink = EvalSink(cfg.eval, r.max_new_tokens, start_step, cfg.run.total_steps, task)
        self.watcher = WeightWatcher(res.weights.latest_version, self.counter, cfg.weights.sync_timeout_s)
        self.task = task
        self.cursor = cursor or PromptCursor(task)
        self.episode_tokens = episode_tokens(cfg)         # multi-turn budget; None: single-turn
        self.stop_requested = False
        # step accounting: steps are 1-based; batch k is trained at version k-1
        self.built = start_step          # last batch built
        self.trained = start_step        # last StepDone
        self.outstanding: Optional[int] = None
        self.parked: deque[Parked] = deque()
        self.next_request = 1
        self.request_index: dict[int, int] = {}   # train request id -> prompt stream index
        self.admitted_total = 0
        self.empty_run = 0
        self.ckpts = CheckpointBook(run_dir, cfg.run, metrics, res.trainer_req, start_step)
        self.steps = StepLines(cfg, metrics, start_step, resumed)   # the step lines, in order
        self.redispatched: set[int] = set()       # request ids put back after a worker died
        m = r.max_observed_offpolicyness          # the hard age bound (None: the gate alone)
        self.bound = AgeBound(m, len(res.inference_req), start_step) if m is not None else None
        self.abort = False
        self.reused = 0
        self.last_hang: dict[int, str] = {}       # worker -> its last EnvHung line (for its death)
        self.batch_skips: dict[int, list] = {}    # step -> prompts quarantine skipped with it
        self.det = Lockstep(cfg, start_step) if cfg.run.deterministic else None    # run.deterministic
        self.stall = StallGuard(cfg.run.stall_timeout_s)

    # ------------------------------------------------------------------ helpers
    @property
    def target_accepted(self) -> int:
        return self.cfg.run.total_steps * self.cfg.rollout.consumer_batch_size

    @property
    def lockstep(self) -> Optional[Lockstep]:
        """The deterministic schedule, while it holds (a drain after a stop request is free)."""
        return None if self.stop_requested else self.det

    def live_workers(self) -> list[int]:
        return [i for i, ok in enumerate(self.dispatcher.live) if ok]

    def snapshot(self) -> dict:
        """Fields of a metrics tick (read from the metrics thread: plain reads only)."""
        d = self.dispatcher.depths()
        return {"version": self.counter.get(), "trained_step": self.trained,
                "lag": self.trained - self.counter.get(), **d,
                "sink_pending": len(self.sink.pending), "parked": len(self.parked),
                "admitted_total": self.admitted_total, "capacity": self.gate.capacity(),
                "dispatch_paused": self.dispatcher.paused,
                **{f"gate_{k}": v for k, v in self.gate.stats().items()},
                "last_sync_s": self.watcher.last_sync_s, "last_parked_s": self.steps.last_parked_s,
                **{f"last_{k}": v for k, v in self.steps.last_ages.items()}}

    # ------------------------------------------------------------------ inputs
    def _on_control(self, msg) -> None:
        if isinstance(msg, messages.Fatal):
            code = 2 if msg.error.startswith("BadEnvOutput") else 1
            who = worker_name(msg.role, msg.index, self.cfg.actor.world_size)
            raise WorkerFatal(f"{who} failed: {msg.error}", msg.role, msg.index, msg.error, code)
        if isinstance(msg, messages.WeightsLoaded):
            if self.watcher.on_ack(msg.index, msg.version) is not None:
                self._on_synced()
        elif isinstance(msg, messages.Aborted):
            if self.bound is not None:
                self.bound.abort_done(msg.request_id, msg.result_sent)
        elif isinstance(msg, messages.EnvHung):
            self.last_hang[msg.index] = msg.why
            q = self.cursor.quarantine
            if q is not None and q.hung(msg.row, msg.prompt_id, msg.why):
                self.metrics.write("event", event="row_quarantined", row=msg.row,
                                   prompt_id=msg.prompt_id, hangs=q.hangs[msg.row], why=msg.why)
        elif isinstance(msg, messages.StepDone):
            self._on_step_done(msg)
        elif isinstance(msg, messages.CheckpointSaved):
            self.ckpts.saved(msg.step, self.steps.written)
        elif isinstance(msg, messages.Ready) and msg.role == "inference":
            self._revive(msg.index)

    def _on_rollout(self, raw) -> None:
        group = decode(raw)
        if self.bound is not None:
            if self.bound.late_result(group):       # aborted by the bound: its prompt is redone
                return
            self.bound.forget(group.ident)
        entry = self.dispatcher.inflight.get(group.ident)
        if entry is None:
            log.warning("dropping rollout for unknown request %d", group.ident)
            return
        check_rollout(group, entry[1], self.episode_tokens)
        gen = self.dispatcher.finished(group.ident, group)
        if not gen.eval:
            self.gate.on_accepted()

    def drain_inputs(self) -> int:
        n = 0
        for ring in self.res.inference_ctl + [self.res.trainer_ctl] + self.res.rank_ctl:
            while (msg := recv(ring, 0.0)) is not None:
                self._on_control(msg)
                n += 1
        for ring in self.res.inference_out:
            while not self.dispatcher.out_queue_full():
                try:
                    raw = ring.get(timeout=0.0)
                except TimeoutError:
                    break
                self._on_rollout(raw)
                n += 1
        return n

    # ------------------------------------------------------------------ admission
    def _new_request(self, index: Optional[int] = None) -> int:
        """A fresh request id; a training prompt's stream index is recorded against it."""
        rid = self.next_request
        self.next_request += 1
        if index is not None:
            self.request_index[rid] = index
        return rid

    def _pump(self) -> int:
        """Submit queued prompts to workers; the gate counts training ones as running. A prompt
        re-dispatched after a worker died is not a new admission."""
        n = 0
        for m in self.dispatcher.pump():
            if not m.eval:
                self.gate.on_submitted()
                if self.bound is not None:
                    self.bound.dispatched(m.request_id, self.dispatcher.inflight[m.request_id][0])
                if m.request_id in self.redispatched:
                    self.redispatched.discard(m.request_id)
                else:
                    n += 1
        self.steps.admitted += n
        self.admitted_total += n
        return n

    def admit(self) -> int:
        """Admit new prompts while the gate has capacity and the step target needs them."""
        n = self._pump()                   # re-dispatched or eval prompts queued earlier first
        if self.stop_requested:
            return n
        if self.det is not None:
            return n + self._admit_wave()
        r = self.cfg.rollout
        while not self.dispatcher.in_queue and not self.dispatcher.paused:
            if self.bound is not None and not self.bound.can_start(self.built, self.live_workers()):
                break
            s = self.gate.stats()
            needed = self.target_accepted - (s["accepted"] + s["running"] + s["enqueued"])
            if needed <= 0 or self.gate.capacity() <= 0:
                break
            index, pid, tokens, row = self.cursor.next()
            rid = self._new_request(index)
            self.gate.on_enqueued()
            self.dispatcher.enqueue(messages.Generate(
                request_id=rid, prompt_id=pid, prompt_tokens=tokens.tolist(), n=r.group_size,
                max_new_tokens=r.max_new_tokens, temperature=r.temperature, row=row))
            n += self._pump()
        return n

    def _admit_wave(self) -> int:
        """run.deterministic: the prompts of batch built + 1 (or the refill it needs) as one wave,
        once its version is live and nothing else generates (`loop.lockstep`)."""
        d, r = self.det, self.cfg.rollout
        if d.wave is not None or self.eval_sink.active or self.dispatcher.in_queue \
                or self.dispatcher.paused or not self.live_workers() \
                or not d.schedule.wave_due(self.built, self.counter.get()):
            return 0
        msgs = []
        for _ in range(r.consumer_batch_size - len(self.sink.pending)):
            index, pid, tokens, row = self.cursor.next()
            self.gate.on_enqueued()
            msgs.append(messages.Generate(
                request_id=self._new_request(index), prompt_id=pid, prompt_tokens=tokens.tolist(),
                n=r.group_size, max_new_tokens=r.max_new_tokens, temperature=r.temperature, row=row,
                key=train_key(self.cfg.run.seed, index)))
        if not msgs:
            return 0
        d.wave = Wave([m.request_id for m in msgs])
        self._send_wave(msgs)
        return self._pump()

    def _send_wave(self, msgs: list[messages.Generate]) -> None:
        for m, (w, hold) in zip(msgs, pins(len(msgs), self.live_workers())):
            m.hold = hold
            self.dispatcher.enqueue(m, worker=w)

    # ------------------------------------------------------------------ sinks
    def consume(self) -> int:
        n = 0
        while self.dispatcher.out_queue:
            group = self.dispatcher.out_queue.popleft()
            n += 1
            if group.kind == 1:
                summary = self.eval_sink.add(group.ident, group)
                if summary:
                    self.metrics.write(**summary)
                continue
            for g in [group] if self.det is None else self.det.arrive(group):
                self._to_sink(g)      # deterministic: a wave's groups, in stream order
        while True:
            if self.bound is not None:     # the next batch trains at version `built`
                for rid in enforce(self.bound, self.built, self.dispatcher, self.gate, self.sink):
                    self._readmit(rid)
            if not (self.sink.ready() and self.built < self.cfg.run.total_steps):
                break
            step = self.built + 1
            batch, info = self.sink.take_batch(step, version=step - 1)
            if self.cursor.quarantine is not None:     # prompts skipped meanwhile ride with it
                self.batch_skips[step], fields = self.cursor.quarantine.take()
                info.episode.update(fields)
            info.episode.update(self.cursor.source_fields(info.parts, self.request_index))
            if self.bound is not None:
                for g in info.parts:
                    self.bound.trained(g)
            record = encode(batch)         # persisted, then shipped as is (never mutated)
            path = os.path.join(self.run_dir, "batches", f"step_{step:08d}.rec")
            write_record(path, record, durable=False, compress=self.cfg.run.batch_compression)
            self.ckpts.note_batch(path)
            self.parked.append(Parked(step, record, info, time.monotonic()))
            self.built = step
            n += 1
        return n

    def _to_sink(self, group) -> None:
        if not self.sink.add(group):         # dynamic sampling: its slot goes to a new prompt
            self.gate.on_dropped()
            self.steps.filtered += 1

    def _readmit(self, request_id: int) -> None:
        self.redispatched.discard(request_id)
        index = self.request_index.pop(request_id, None)
        if index is not None:
            self.cursor.redo.append(index)
        self._forget(request_id)

    def _forget(self, request_id: int) -> None:
        """A train request that will not come back leaves its wave (a refill wave redoes it)."""
        if self.det is not None:
            for g in self.det.forget(request_id):
                self._to_sink(g)

    def ship(self) -> bool:
        # a save in progress does not hold the next batch: SaveCheckpoint is on the trainer's control
        # ring before the batch is put, the trainer snapshots first and writes in the background
        if self.outstanding is not None or not self.parked:
            return False
        p = self.parked[0]
        if p.step != self.trained + 1:
            raise RunFailed(f"internal: batch {p.step} is next but trainer is at step {self.trained}")
        d = self.lockstep
        if d is not None and (d.ckpt_due is not None
                              or not d.schedule.may_ship(p.step, self.counter.get())):
            return False
        try:
            self.res.batches.put(p.record, timeout=0.0)
        except TimeoutError:
            return False
        self.parked.popleft()
        self.outstanding = p.step
        self.steps.shipped(p.step, p.info, time.monotonic() - p.since)
        return True

    # ------------------------------------------------------------------ trainer / watcher
    def _on_step_done(self, msg: messages.StepDone) -> None:
        if msg.step != self.outstanding:
            raise RunFailed(f"trainer reported step {msg.step}, expected {self.outstanding}")
        self.outstanding = None
        self.trained = msg.step
        info = self.steps.done(msg)
        for g in info.parts + info.filtered:       # consumed: no resume redoes them
            self.request_index.pop(g.ident, None)
        if self.cursor.quarantine is not None:
            self.cursor.quarantine.consumed(self.batch_skips.pop(msg.step, []))
        self.watcher.note_publish_time(msg.version, msg.publish_time)
        self._flush_steps()
        if info.trainable == 0:
            self.empty_run += 1
            if self.empty_run >= self.cfg.run.empty_batch_limit:
                raise EmptyBatches(
                    f"{self.empty_run} consecutive batches had no trainable token after filtering "
                    f"(run.empty_batch_limit={self.cfg.run.empty_batch_limit}): check the task's "
                    f"reward function / environment", 1)
        else:
            self.empty_run = 0
        every = self.cfg.run.checkpoint_every
        if msg.step == self.cfg.run.total_steps or (every and msg.step % every == 0):
            if self.lockstep is not None:       # once the batches generated before it are built
                self.det.ckpt_due = msg.step
                self._checkpoint_when_ready()
            else:
                self.request_checkpoint(msg.step)
        self.ship()          # the trainer is idle until the next batch: before any other work

    def _on_synced(self) -> None:
        if self.cfg.gpu_weights:
            send(self.res.trainer_req, messages.ReleaseWeights(version=self.counter.get()))
        if self.cfg.weights.pause_during_sync and not self.stop_requested:
            self.dispatcher.resume()
        self._flush_steps()
        version = self.counter.get()
        if self.eval_sink.due(version):
            msgs = self.eval_sink.open_round(version, self.task.eval_prompts(), self._new_request)
            if self.lockstep is not None and msgs:     # a wave of its own, keyed by position
                for pos, m in enumerate(msgs):
                    m.key = eval_key(self.cfg.run.seed, version, pos)
                self._send_wave(msgs)
            else:
                for m in msgs:
                    self.dispatcher.enqueue(m)

    def _flush_steps(self) -> None:
        self.steps.flush(self.counter.get(), self._line_extra)
        self.ckpts.commit_ready(self.steps.written)

    def _line_extra(self) -> dict:
        """The step line's fields the loop knows at the moment it is written."""
        return {"out_queue_depth": len(self.dispatcher.out_queue) + len(self.sink.pending),
                "weight_sync_s": self.watcher.last_sync_s,
                **(self.bound.take_counts() if self.bound is not None else {})}

    def watch(self) -> None:
        self._checkpoint_when_ready()
        d = self.lockstep      # deterministic: no reload until every batch of this version is built
        if d is not None and (self.eval_sink.active
                              or not d.schedule.may_sync(self.built, self.counter.get())):
            return
        target = self.watcher.poll(self.live_workers())
        if target is not None:
            if self.cfg.weights.pause_during_sync:
                self.dispatcher.pause()
            self.dispatcher.broadcast(messages.LoadWeights(version=target))
            if self.bound is not None:
                self.bound.weights_sent(self.live_workers(), target)
            if self.watcher.target is None:      # committed at once (no live workers)
                self._on_synced()

    # ------------------------------------------------------------------ main
    def finished(self) -> bool:
        return (self.trained >= self.cfg.run.total_steps and self.outstanding is None
                and self.ckpts.idle and self.watcher.target is None
                and self.counter.get() >= self.cfg.run.total_steps
                and not self.eval_sink.active)

    def drained(self) -> bool:
        """After a stop request: nothing in flight, nothing shippable, trainer idle, checkpointed."""
        idle = (not self.dispatcher.inflight and self.outstanding is None and not self.parked
                and self.watcher.target is None and self.ckpts.idle)
        if idle and self.ckpts.last_ckpt < self.trained:
            self.request_checkpoint(self.trained)
            return False
        return idle

    def iterate(self) -> bool:
        """One turn of the loop; returns True when the run is complete."""
        if self.stop_requested and not self.dispatcher.paused and not self.dispatcher.pinned:
            self.dispatcher.pause()          # drain: queued prompts stay queued (redone on resume),
            # once a deterministic wave begun is all sent (its workers wait for its last request)
        busy = self.drain_inputs()
        self.watch()
        busy += self.admit()
        busy += self.consume()
        busy += self.ship()
        if self.finished():
            return True
        self.stall.check(self._stalled(), self._where)
        if not busy:
            self.res.bell.wait(IDLE_WAIT_S)
        return False

    def _stalled(self) -> bool:
        """Nothing any component is doing that could move the run on (`loop.stall`)."""
        return (not self.stop_requested and not self.dispatcher.inflight
                and not self.dispatcher.in_queue and not self.dispatcher.out_queue
                and self.outstanding is None and self.watcher.target is None and self.ckpts.idle)

    def _where(self) -> str:
        return (f"built {self.built}, trained {self.trained}, version {self.counter.get()}, "
                f"parked {len(self.parked)}, sink {len(self.sink.pending)} groups, "
                f"gate capacity {self.gate.capacity()}")
