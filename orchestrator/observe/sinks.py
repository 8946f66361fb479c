"""Metric sinks beside `metrics.jsonl`: TensorBoard event files and Weights & Biases.

Contract: `MetricSinks.from_config(cfg, run_dir)` returns None when no sink is configured
(`metrics.tensorboard`, `metrics.wandb.project`); otherwise `write(rec)` takes every record the
`MetricsLog` writes (it is its `on_write` hook) and `close(timeout_s)` flushes and ends the sinks.
`metrics.jsonl` stays the source of truth: a sink never slows or stops the run. Records go through a
bounded queue to one daemon thread (`write` never blocks: past `QUEUE_MAX` pending records the newest
are dropped and counted), which starts each sink (imports included) on its first record. A sink that
fails (library not installed, disk full, a network error in online mode) warns once on stderr and in
the supervisor log, naming the sink, and is dropped; the others go on.

Stable names, one scalar per numeric field (bools as 0/1; None, strings and lists skipped):
- step lines: `train/<field>` at x = `step`;
- eval lines: `eval/<field>` at x = `step`;
- tick lines: `pipeline/<field>` at x = `trained_step` (the last trained step);
- event lines (`worker_restart`, `resume`, ...): `events/<event>` = running count at the last step.
TensorBoard writes under `RUN_DIR/tensorboard/` with each record's wall time. W&B runs offline unless
`metrics.wandb.mode: online`, in `RUN_DIR/wandb/`; every launch of a run dir continues one W&B run (its
id is kept in `RUN_DIR/logs/wandb_run_id`), each panel keyed by its own step metric.
"""
from __future__ import annotations

import logging
import os
import queue
import secrets
import sys
import threading
from typing import Callable, Iterator, Optional

log = logging.getLogger("orchestrator.observe.sinks")

QUEUE_MAX = 100_000
PREFIX = {"step": "train", "eval": "eval", "tick": "pipeline"}
NOT_VALUES = {"kind", "time", "step"}


def scalars(rec: dict) -> Iterator[tuple[str, float]]:
    """(stable name, value) of every numeric field of a record (see the module docstring)."""
    prefix = PREFIX.get(rec.get("kind"))
    if prefix is None:
        return
    for k, v in rec.items():
        if k in NOT_VALUES or v is None or isinstance(v, (str, list, dict)):
            continue
        if isinstance(v, (bool, int, float)):
            yield f"{prefix}/{k}", float(v)


class _Sink:
    name = "sink"

    def write(self, rec: dict, x: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardSink(_Sink):
    """Event files read by TensorBoard, written with tensorboard's own writer (no torch import)."""
    name = "tensorboard"

    def __init__(self, logdir: str):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._Event, self._Summary = Event, Summary
        self._writer = EventFileWriter(logdir, max_queue_size=100, flush_secs=5)

    def write(self, rec: dict, x: int) -> None:
        values = [self._Summary.Value(tag=t, simple_value=v) for t, v in _named(rec)]
        if values:
            self._writer.add_event(self._Event(wall_time=rec["time"], step=x,
                                               summary=self._Summary(value=values)))

    def close(self) -> None:
        self._writer.close()


class WandbSink(_Sink):
    """A W&B run (offline by default): one `wandb.log` per record, each family on its step metric."""
    name = "wandb"

    def __init__(self, cfg, run_dir: str):
        import wandb
        w = cfg.metrics.wandb
        id_path = os.path.join(run_dir, "logs", "wandb_run_id")
        run_id = open(id_path).read().strip() if os.path.exists(id_path) else None
        if not run_id:
            run_id = secrets.token_hex(4)
            with open(id_path, "w") as f:
                f.write(run_id + "\n")
        self._wandb = wandb
        self._run = wandb.init(project=w.project, entity=w.entity, name=w.name, group=w.group,
                               id=run_id, resume="allow", mode=w.mode, dir=run_dir,
                               config=cfg.model_dump(mode="json"),
                               settings=wandb.Settings(console="off", silent=True))
        for family in (*PREFIX.values(), "events"):
            self._run.define_metric(f"{family}/step")
            self._run.define_metric(f"{family}/*", step_metric=f"{family}/step")

    def write(self, rec: dict, x: int) -> None:
        data = dict(_named(rec))
        if data:
            family = next(iter(data)).split("/", 1)[0]
            data[f"{family}/step"] = x
            self._run.log(data)

    def close(self) -> None:
        self._run.finish()


def _named(rec: dict) -> Iterator[tuple[str, float]]:
    if rec.get("kind") == "event":
        yield f"events/{rec['event']}", float(rec["count"])
    else:
        yield from scalars(rec)


class MetricSinks:
    def __init__(self, factories: list[tuple[str, Callable[[], _Sink]]], warn: Callable[[str], None]):
        self._factories, self._warn = factories, warn
        self._q: "queue.Queue[Optional[dict]]" = queue.Queue(QUEUE_MAX)
        self.dropped = 0
        self._step = 0
        self._events: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name="metric-sinks", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, cfg, run_dir: str, warn: Optional[Callable[[str], None]] = None
                    ) -> Optional["MetricSinks"]:
        m = cfg.metrics
        factories: list[tuple[str, Callable[[], _Sink]]] = []
        if m.tensorboard:
            factories.append(("tensorboard",
                              lambda: TensorBoardSink(os.path.join(run_dir, "tensorboard"))))
        if m.wandb.project:
            factories.append(("wandb", lambda: WandbSink(cfg, run_dir)))
        return cls(factories, warn or _warn) if factories else None

    def write(self, rec: dict) -> None:
        try:
            self._q.put_nowait(rec)
        except queue.Full:
            if not self.dropped:
                self._warn(f"metric sinks fell {QUEUE_MAX} records behind; dropping records for "
                           f"them (metrics.jsonl has every one)")
            self.dropped += 1

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what is queued and end every sink, waiting at most `timeout_s`."""
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    # ------------------------------------------------------------------ sink thread
    def _run(self) -> None:
        sinks: list[_Sink] = []
        for name, make in self._factories:
            try:
                sinks.append(make())
            except BaseException as exc:       # noqa: BLE001 - a sink never stops the run
                self._fail(name, exc)
        while (rec := self._q.get()) is not None:
            x, rec = self._x(rec)
            for s in list(sinks):
                try:
                    s.write(rec, x)
                except BaseException as exc:   # noqa: BLE001
                    sinks.remove(s)
                    self._fail(s.name, exc)
        for s in sinks:
            try:
                s.close()
            except BaseException as exc:       # noqa: BLE001
                self._fail(s.name, exc)

    def _x(self, rec: dict) -> tuple[int, dict]:
        """The record's x (its step, or the last step for ticks and events) and the record (an
        event gets its running count; the caller's dict is never changed)."""
        kind = rec.get("kind")
        if kind in ("step", "eval"):
            self._step = int(rec["step"])
        elif kind == "tick":
            self._step = max(self._step, int(rec.get("trained_step") or 0))
        elif kind == "event":
            name = str(rec.get("event"))
            self._events[name] = self._events.get(name, 0) + 1
            return self._step, {**rec, "count": self._events[name]}
        return self._step, rec

    def _fail(self, name: str, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        self._warn(f"metrics sink {name} failed ({why}); the run goes on without it "
                   f"(metrics.jsonl has every record)")


def _warn(line: str) -> None:
    log.warning("%s", line)
    print(f"warning: {line}", file=sys.stderr, flush=True)
