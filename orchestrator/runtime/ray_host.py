"""Node side of `placement.mode: ray`: the Ray actor that hosts one inference worker process.

Ray decides where an inference worker runs (a bundle of the run's placement group,
`orchestrator.runtime.ray_cluster`); the worker itself is the same process as in local mode
(`inference_worker.main`, the same rings, words and weight buffer). `WorkerHost` is the actor that
starts it on its node and, for a worker on another node than the supervisor's, carries its traffic
(this module imports no Ray; `ray_cluster` makes the class an actor):

- `WorkerHost(bridged, preload)`: with `preload` (the modules the driver's fork server imports,
  `forkserver.preload_for`) the actor starts a fork server of its own at once (`forkserver.Spawner`,
  its ready file in a scratch directory of this process), which imports them while the driver
  goes on; a bridged host imports torch for its gloo pair meanwhile. Without (`preload=None`, the
  benchmark's host) nothing is started before `start`.
- `start(spec, sizes, weight_nbytes) -> pid`: starts the worker, forked by this actor's fork server
  (started here if `__init__` did not; ready within `SERVER_S`), as a local worker is by the
  run's: its modules imported once per host, not by every start (a spawned worker imported Ray's
  own worker module, torch and transformers: ~6 s of a first step on 2 cores). Its parent is that
  server, which ends when this actor's process does (its pipe), so the worker dies with the actor
  (`worker_base.die_with_parent`). Bridged (`WorkerHost(True)`, a
  worker on another node): first sweeps this node's segments and scratch directories of dead runs,
  then makes the worker's objects here under a namespace of its own (`RunNames` with this process's
  run id: its version word and bell, weight buffer, request/rollout/control rings and progress/liveness words) and a
  scratch directory of its own, so nothing of the supervisor's node is needed. Not bridged (the
  supervisor's node): the worker attaches the supervisor's objects by their names, as in local mode.
  A restart calls `start` again with the next generation (the old objects are freed first).
- `pair(ip, port, key, device_ip, timeout_s) -> int` (bridged, after `start`): joins the gloo pair
  `key` the driver makes for this worker (`ray_weights`: rank 1, this node's end bound to
  `device_ip`, the driver's store at ip:port); a previous pair is closed first, so a restarted
  worker never uses a pair that failed mid-transfer. Returns this actor's pid.
- `exchange(frames, weights, wait_s) -> dict` (bridged): the supervisor's pump hands over request
  records (`Frames`: sequence numbered and CRC-checked; a gap or a bad checksum raises
  `ChannelError`, never wrong bytes); with `weights` (a `LoadWeights` among them) it first receives
  the published version over the pair straight into this node's weight buffer and publishes it
  there (buckets CRC-checked: damage or a peer that stops raises within the pair's timeout, nothing
  is published); the records go into the worker's request ring as space allows (the rest wait
  here; `pending` says how many, and the pump sends no more meanwhile, so the request ring's
  back-pressure reaches the supervisor). It returns what the worker put on its rollout and control
  rings (framed, at most `PULL_BYTES` a call), the ages of its progress and liveness words in ms
  (None while never stamped), and its exit code (None while it runs). With nothing to return it
  waits up to `wait_s` on the worker's bell.
- `status()` (not bridged): the exit code. `kill_worker()`: SIGKILL to the worker. `close()`:
  kills the worker, closes its pair, frees everything `start` made, kills and reaps the fork server
  and removes the scratch directories; bounded.
Not built: NCCL between GPUs for GPU inference workers on other nodes (ray mode has none yet).
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import zlib
from collections import deque
from typing import Optional

from orchestrator.errors import ChannelError
from orchestrator.runtime import scratch
from orchestrator.runtime.liveness import now_ms
from orchestrator.runtime.resources import Resources, RingSizes, RunNames, free_resources
from orchestrator.runtime.worker_base import WorkerSpec

PULL_BYTES = 64 << 20          # records returned by one exchange (at least one record)
JOIN_S = 2.0                   # a killed worker is reaped within this
SERVER_S = 120.0               # the host's fork server imports the workers' modules within this


class Frames:
    """One direction of a record stream: `wrap(data) -> (seq, crc, data)` numbers records from 0;
    `unwrap(frame) -> data` checks the next number and the CRC-32 (ChannelError otherwise)."""

    def __init__(self, what: str) -> None:
        self.what, self.sent, self.got = what, 0, 0

    def wrap(self, data: bytes) -> tuple:
        self.sent += 1
        return self.sent - 1, zlib.crc32(data), data

    def unwrap(self, frame: tuple) -> bytes:
        seq, crc, data = frame
        if seq != self.got:
            raise ChannelError(f"{self.what}: record {seq} arrived where {self.got} was due "
                               f"(a record was lost or repeated)")
        if zlib.crc32(data) != crc:
            raise ChannelError(f"{self.what}: record {seq} failed its CRC-32 check")
        self.got += 1
        return data


class WorkerHost:
    def __init__(self, bridged: bool, preload: Optional[tuple] = None) -> None:
        self.bridged = bridged
        self.spawner = None                       # this actor's fork server (`_server`)
        self.server_dir = ""
        if preload is not None:
            self._server(tuple(preload))
            if bridged:                           # the pair's torch, while the server imports
                from orchestrator.runtime import ray_weights  # noqa: F401
        self.proc = None                          # the worker (a forkserver Process)
        self.res: Optional[Resources] = None     # bridged: the worker's objects on this node
        self.scratch = ""
        self.pending: deque = deque()
        self.req = self.out = self.ctl = None
        self.words: tuple = ()
        self.weights = None                       # bridged: the gloo pair the weights arrive on

    def node_id(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def prepare(self, spec: WorkerSpec, sizes: RingSizes, weight_nbytes: int) -> WorkerSpec:
        """The spec the worker starts with: any previous worker stopped and its objects freed;
        bridged, this node's objects made (`scripts/bench_placement.py` drives them without a
        worker)."""
        self._stop_worker()
        self._unpair()
        self._free()
        spec = dataclasses.replace(spec, parent_pid=os.getpid(),
                                   devices=tuple(str(int(g)) for g in _gpu_ids()))
        return self._own_objects(spec, sizes, weight_nbytes) if self.bridged else spec

    def _server(self, preload: tuple) -> int:
        from orchestrator.runtime.forkserver import Spawner
        if self.spawner is None:
            self.spawner = Spawner(preload=preload)
            self.server_dir = scratch.create(f"{os.getpid()}-host{secrets.token_hex(3)}")
        return self.spawner.start_server(self.server_dir)

    def start(self, spec: WorkerSpec, sizes: RingSizes, weight_nbytes: int) -> int:
        from orchestrator.runtime import forkserver, inference_worker
        server = self._server(forkserver.WORKERS)
        spec = dataclasses.replace(self.prepare(spec, sizes, weight_nbytes), parent_pid=server)
        self.spawner.wait_ready(SERVER_S, lambda: None)
        self.proc = self.spawner.process(inference_worker.main, (spec,),
                                         f"arl-inference{spec.index}g{spec.gen}")
        self.proc.start()
        return self.proc.pid

    def _own_objects(self, spec: WorkerSpec, sizes: RingSizes, weight_nbytes: int) -> WorkerSpec:
        """This node's copies of the worker's objects (a `Resources` of its own, under a run id of
        this process's own), made as the supervisor makes a worker's."""
        from shm.segments import sweep_dead
        sweep_dead()
        scratch.sweep_dead()
        names = RunNames(f"{os.getpid()}-{secrets.token_hex(3)}", spec.names.num_inference)
        i, gen = spec.index, spec.gen
        self.res = res = Resources(names, sizes=sizes)
        res.core(weight_nbytes)       # the version word too: the bell's sweep is judged by it
        self.req, self.out, self.ctl = res.inference_rings(i, gen)
        res.fresh_words("inference", i, gen)
        self.words = (res.heartbeats[("inference", i)], res.liveness[("inference", i)])
        self.scratch = scratch.create(names.run_id)
        self.pending.clear()
        self.frames_in = Frames("requests to the worker")
        self.frames_out = Frames("rollouts from the worker")
        self.frames_ctl = Frames("control records from the worker")
        return dataclasses.replace(spec, names=names, env={**spec.env, scratch.ENV: self.scratch})

    def pair(self, ip: str, port: int, key: str, device_ip: str, timeout_s: float) -> int:
        from orchestrator.runtime import ray_weights       # torch: only a bridged host needs it
        self._unpair()
        self.weights = ray_weights.join(ip, port, key, device_ip, timeout_s)
        return os.getpid()

    def _unpair(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None

    def exchange(self, frames: list, weights: bool = False, wait_s: float = 0.05) -> dict:
        for frame in frames:
            self.pending.append(self.frames_in.unwrap(frame))
        if weights:                    # before the LoadWeights record that names it
            if self.weights is None:
                raise ChannelError("weights were announced but this host has no gloo pair")
            try:
                self.weights.recv_into(self.res.weights)
            except ChannelError:
                raise
            except Exception as exc:   # gloo: the peer closed or stalled past the timeout
                raise ChannelError(f"weights over gloo: {type(exc).__name__}: "
                                   f"{first_line(exc)}") from None
        while self.pending:
            try:
                self.req.put(self.pending[0], timeout=0.0)
            except TimeoutError:
                break
            self.pending.popleft()
        out, ctl = _drain(self.out, self.frames_out), _drain(self.ctl, self.frames_ctl)
        if not out and not ctl and self.status() is None and self.res.bell.wait(wait_s):
            out, ctl = _drain(self.out, self.frames_out), _drain(self.ctl, self.frames_ctl)
        progress, alive = (w.get() for w in self.words)
        now = now_ms()
        return {"out": out, "ctl": ctl, "pending": len(self.pending), "exitcode": self.status(),
                "progress_age_ms": now - progress if progress else None,
                "liveness_age_ms": now - alive if alive else None}

    def status(self) -> Optional[int]:
        """The worker's exit code, None while it runs (or before one starts)."""
        return None if self.proc is None else self.proc.exitcode

    def kill_worker(self) -> None:
        if self.proc is not None and self.proc.exitcode is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _stop_worker(self) -> None:
        if self.proc is not None:
            self.kill_worker()
            self.proc.join(JOIN_S)

    def _free(self) -> None:
        if self.res is not None:
            free_resources(self.res)
            self.res = None
        if self.scratch:
            scratch.remove(self.scratch)
            self.scratch = ""

    def close(self) -> None:
        self._stop_worker()
        self._unpair()
        self._free()
        if self.spawner is not None:
            self.spawner.close()
            self.spawner = None
        if self.server_dir:
            scratch.remove(self.server_dir)
            self.server_dir = ""


def _drain(ring, frames: Frames) -> list:
    got, size = [], 0
    while size < PULL_BYTES:
        try:
            data = ring.get(timeout=0.0)
        except TimeoutError:
            break
        got.append(frames.wrap(data))
        size += len(data)
    return got


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _gpu_ids() -> list:
    """The GPUs Ray gave this actor (its bundle's), as device indices of this node."""
    import ray
    return ray.get_gpu_ids()
