"""Driver side of `placement.mode: ray`: inference workers placed on a Ray cluster.

The supervisor, event loop, gate, sinks, checkpoints and messages stay as in local mode; only where an
inference worker runs changes. The supervisor is the Ray driver; trainer ranks stay its children on
its node (the batch ring stays shared memory). Ray is imported here only, and only in ray mode.

- `RayCluster(cfg, run_id).connect(check)` (before anything else starts; `res`, the run's shm
  objects, is set before the first `start`): joins the cluster (`ray_connect.join`: the address
  probed, a loopback-only cluster joined as 127.0.0.1, `ray.init` bounded by
  `placement.ray_timeout_s`), then one placement group of `inference.num_workers` bundles
  (`placement.strategy`), each {CPU: inference.threads_per_worker, GPU: placement.inference_gpus,
  **placement.inference_resources}. Refusals are `RunFailed(..., 2)` in one line naming what is
  wrong: no cluster at the address, Ray versions of the driver and the cluster differ, resources no
  node or the whole cluster has (named, with what the cluster has). A wait past
  `placement.ray_timeout_s` is `RunFailed(..., 1)` naming it: ray.init that does not return, a
  group the cluster could hold but does not place (its resources taken: what is available is named).
  `check()` (the supervisor's stop check) is called while waiting.
- `start(spec) -> HostedWorker`: the worker's host actor
  (`orchestrator.runtime.ray_host.WorkerHost`) in bundle `spec.index` (kept across restarts while it
  lives, a new one in the same bundle otherwise) starts the worker. Bridged when the bundle's node is
  not the driver's: the worker's records then travel over Ray (`HostedWorker`'s pump) and its
  weights over a gloo pair of its own (`ray_weights`: made at every start, so a restarted worker or
  host gets a new one; the run's store on the driver's node, each end bound to its node's IP as Ray
  reports it); else it attaches the supervisor's shm objects (rings and weight buffer) as in local
  mode. The choice is logged per worker ("records over Ray", "weights over gloo from ip:port").
- `HostedWorker` stands for the worker process where the supervisor keeps its processes (`pid`,
  `exitcode`, `is_alive()`, `kill()`, `join(timeout)`), so death, hangs, restarts and shutdown are
  handled as for a local worker; a host actor that dies (its node lost) is a dead worker (exit code
  -9) named so in the log. Its pump thread (owned by it, ended by the worker's exit or `stop()`,
  joined within `PUMP_JOIN_S`; it closes the worker's pair when it ends) moves a bridged worker's
  traffic: records from the supervisor's request ring go to the host, at most one `LoadWeights` per
  call: that call is issued first, then the pump sends the latest published version (>= the
  record's) over the pair straight from the supervisor's shm slot in `placement.weight_bucket_mb`
  buckets, then awaits the call, whose host has received, checked and published it before it
  forwards the record (the worker loads, verifies and acknowledges with `WeightsLoaded` as in local
  mode). What the host returns goes into the supervisor's rollout and control rings (the doorbell
  rung) and its progress and liveness ages into the supervisor's words, so `liveness.overdue` judges
  a remote worker as a local one. Every Ray call has a timeout (`CALL_TIMEOUT_S`), every gloo
  operation `GLOO_TIMEOUT_S`; a call or a transfer that fails (damaged, cut, stalled) is the host's
  death. When the pump ends it logs what went over its pair (versions, MB, buckets).
  Why the sender is here and not in trainer rank 0: see `ray_weights`.
- `close(deadline)`: stops every pump, closes every host (its worker killed, its node's objects
  freed), kills the actors, removes the placement group and disconnects; bounded by `deadline`
  plus `CALL_TIMEOUT_S`. A driver killed with SIGKILL takes its actors with it (Ray's owner
  semantics: they belong to the driver's job) and their workers die with them.
Ray mode needs torch on every node (the `ray` extra brings it): `connect` refuses to start without it
(exit 2). Not built yet (issue #27): GPU inference workers in ray mode (CUDA IPC on the driver's
node, NCCL between nodes: weights to other nodes go over gloo on CPU).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import threading
import time
from typing import Optional

from orchestrator import messages
from orchestrator.errors import RunFailed
from orchestrator.runtime import ray_connect
from orchestrator.runtime.liveness import now_ms
from orchestrator.runtime.ray_host import ChannelError, Frames, WorkerHost, first_line

log = logging.getLogger("orchestrator.runtime.ray_cluster")
CALL_TIMEOUT_S = 30.0      # one Ray call (an exchange waits at most WAIT_S of it)
WAIT_S = 0.05              # a host waits this long for records before answering empty
STATUS_S = 0.1             # a hosted, not bridged, worker's exit code is asked this often
PUMP_JOIN_S = 5.0
LOST = -9                  # the exit code of a worker whose host actor died
MAX_FRAMES = 64            # request records per exchange
CARRY_WAIT_S = 0.005       # a pump whose records wait for room in the supervisor's ring pauses
GLOO_TIMEOUT_S = 20.0      # a pair's rendezvous (the host imports torch first) and each gloo op;
                           # under CALL_TIMEOUT_S, so a host stuck in a receive is free again by then


def _ray():
    import ray
    return ray


class RayCluster:
    def __init__(self, cfg, run_id: str) -> None:
        self.cfg, self.run_id = cfg, run_id
        self.res = None                            # the run's shm objects, set before `start`
        self.pg = None
        self.driver_node = ""
        self.hosts: dict[int, tuple] = {}          # worker index -> (actor, bridged, node id)
        self.workers: list["HostedWorker"] = []
        self._rendezvous = None                    # the gloo pairs' store, made at the first bridged start
        self._actor_cls = None

    # ------------------------------------------------------------------ connect
    def connect(self, check=lambda: None) -> None:
        """`check()` is called while the cluster is waited for (the supervisor's stop check)."""
        ray = _ray()
        place = self.cfg.placement
        if importlib.util.find_spec("torch") is None:
            raise RunFailed("placement.mode=ray needs torch (weights to inference workers on other "
                            "nodes go over a torch.distributed gloo pair): pip install -e '.[ray]'", 2)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__import__("orchestrator").__file__)))
        address = ray_connect.join(place, root, check)
        self.driver_node = ray.get_runtime_context().get_node_id()
        bundles = [self._bundle() for _ in range(self.cfg.inference.num_workers)]
        self._check_resources(bundles[0], len(bundles))
        from ray.util import placement_group, remove_placement_group
        self.pg = placement_group(bundles, strategy=place.strategy, name=f"arl-{self.run_id}")
        ready, deadline = self.pg.ready(), time.monotonic() + place.ray_timeout_s
        while True:                 # in slices, so a stop signal meanwhile is seen
            check()
            try:
                ray.get(ready, timeout=max(0.01, min(1.0, deadline - time.monotonic())))
                break
            except ray.exceptions.GetTimeoutError:
                if time.monotonic() < deadline:
                    continue
                remove_placement_group(self.pg)
                self.pg = None
                raise RunFailed(f"placement: the placement group of {len(bundles)} x {bundles[0]} "
                                f"({place.strategy}) was not placed within placement.ray_timeout_s="
                                f"{place.ray_timeout_s:g} (cluster: {self._totals()}, available: "
                                f"{self._available()})", 1) from None
        self._actor_cls = ray.remote(WorkerHost)
        log.info("Ray %s at %s: placement group %s of %d bundles %s (%s), driver node %s",
                 ray.__version__, address, self.pg.id.hex()[:12], len(bundles), bundles[0],
                 place.strategy, self.driver_node[:12])

    def _bundle(self) -> dict:
        place, inf = self.cfg.placement, self.cfg.inference
        bundle = {"CPU": float(inf.threads_per_worker)}
        if place.inference_gpus:
            bundle["GPU"] = float(place.inference_gpus)
        bundle.update(place.inference_resources)
        return bundle

    def _totals(self) -> dict:
        return {k: v for k, v in _ray().cluster_resources().items() if not k.startswith("node:")}

    def _available(self) -> dict:
        return {k: v for k, v in _ray().available_resources().items() if not k.startswith("node:")}

    def _check_resources(self, bundle: dict, n: int) -> None:
        """A bundle no alive node can hold, or bundles the cluster cannot hold together: exit 2."""
        nodes = [node["Resources"] for node in _ray().nodes() if node.get("Alive")]
        if not any(all(res.get(k, 0.0) >= v for k, v in bundle.items()) for res in nodes):
            short = sorted(k for k, v in bundle.items() if not any(res.get(k, 0.0) >= v for res in nodes))
            raise RunFailed(f"placement: no node of the Ray cluster has {bundle} for an inference "
                            f"worker (short of {short or 'them together'}; cluster: "
                            f"{self._totals()})", 2)
        totals = self._totals()
        short = {k: v * n for k, v in bundle.items() if totals.get(k, 0.0) < v * n}
        if short:
            raise RunFailed(f"placement: {n} inference workers need {short} in all; the Ray "
                            f"cluster has {({k: totals.get(k, 0.0) for k in short})}", 2)

    # ------------------------------------------------------------------ workers
    def start(self, spec) -> "HostedWorker":
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        i = spec.index
        actor, bridged, node = self.hosts.get(i, (None, False, ""))
        if actor is not None:
            try:
                ray.get(actor.pid.remote(), timeout=CALL_TIMEOUT_S)
            except Exception:
                actor = None
        timeout = self.cfg.placement.ray_timeout_s
        deadline, first = time.monotonic() + timeout, node
        while True:          # a host on a node that is dying but not yet known dead dies: retry
            if actor is None:
                node = self._bundle_node(i, first, deadline)
                bridged = node != self.driver_node     # its host then carries the worker's traffic
                bundle = self._bundle()
                actor = self._actor_cls.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.pg, placement_group_bundle_index=i),
                    num_cpus=bundle.pop("CPU"), num_gpus=bundle.pop("GPU", 0),
                    resources=bundle).remote(bridged, self._preload())
                self.hosts[i] = (actor, bridged, node)
                log.info("inference worker %d: bundle %d on node %s: %s", i, i, node[:12],
                         "records over Ray (another node)" if bridged else
                         "shm rings (the driver's node)")
            try:
                pid = ray.get(actor.start.remote(spec, self.res.sizes, self.res.weights.nbytes),
                              timeout=max(1.0, deadline - time.monotonic()))   # actor creation too
                pair = self._pair(actor, i, spec.gen, node) if bridged else None
                break
            except Exception as exc:
                if time.monotonic() >= deadline:
                    raise RunFailed(f"inference worker {i}: no Ray host actor (WorkerHost) in "
                                    f"bundle {i} could start it on node {(first or node)[:12]} or "
                                    f"elsewhere within "
                                    f"placement.ray_timeout_s={timeout:g} ({type(exc).__name__}: "
                                    f"{first_line(exc)})") from None
                log.warning("inference worker %d: its host on node %s failed (%s); again",
                            i, node[:12], type(exc).__name__)
                ray.kill(actor)
                actor, first = None, first or node
                time.sleep(STATUS_S)
        worker = HostedWorker(self, actor, bridged, spec, pid, node, pair)
        self.workers.append(worker)
        return worker

    def _preload(self) -> tuple:
        """What a host's fork server imports: the driver's list (no torch for GPU workers)."""
        from orchestrator.runtime import forkserver
        if self.cfg.placement.inference_gpus:
            return forkserver.WORKERS
        return forkserver.preload_for(self.cfg)

    def _pair(self, actor, i: int, gen: int, node: str):
        """A new gloo pair with the host of worker i (the driver's end: rank 0, the sender)."""
        ray = _ray()
        from orchestrator.runtime.ray_weights import Rendezvous
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        if self._rendezvous is None:
            self._rendezvous = Rendezvous(ips[self.driver_node], GLOO_TIMEOUT_S)
        rdv = self._rendezvous
        key = f"{self.run_id}/{i}/{gen}/{secrets.token_hex(3)}"
        joined = actor.pair.remote(rdv.ip, rdv.port, key, ips.get(node, ""), GLOO_TIMEOUT_S)
        try:
            pair = rdv.pair(key)
        except Exception:
            ray.get(joined, timeout=CALL_TIMEOUT_S)     # the host's reason, where it has one
            raise
        try:
            ray.get(joined, timeout=CALL_TIMEOUT_S)
        except BaseException:
            pair.close()
            raise
        log.info("inference worker %d: weights over gloo from %s:%d (a pair of its own, buckets of "
                 "%d MiB, CRC-32 checked)", i, rdv.ip, rdv.port, self.cfg.placement.weight_bucket_mb)
        return pair

    def _bundle_node(self, i: int, lost: str, deadline: float) -> str:
        """The alive node bundle i is placed on, waiting until `deadline` for Ray to place it again
        after its node (`lost`) died; RunFailed naming that node otherwise."""
        ray = _ray()
        from ray.util import placement_group_table
        timeout = self.cfg.placement.ray_timeout_s
        while True:
            table = placement_group_table(self.pg)
            node = table["bundles_to_node_id"].get(i, "")
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            if table["state"] == "CREATED" and node in alive:
                return node
            if time.monotonic() > deadline:
                raise RunFailed(f"inference worker {i}: its node {lost[:12] or node[:12]} is gone and "
                                f"the Ray cluster did not place its bundle {self._bundle()} on another "
                                f"node within placement.ray_timeout_s={timeout:g} (cluster: "
                                f"{self._totals()})")
            time.sleep(STATUS_S)

    # ------------------------------------------------------------------ end
    def close(self, deadline: float) -> None:
        ray = _ray()
        if not ray.is_initialized():
            return
        for w in self.workers:
            w.stop()
        for actor, _, _ in self.hosts.values():
            try:
                ray.get(actor.close.remote(), timeout=max(1.0, deadline - time.monotonic()))
            except Exception as exc:        # a dead host: nothing of it is left to close
                log.info("closing an inference worker's host: %s", type(exc).__name__)
            ray.kill(actor)
        self.hosts.clear()
        if self.pg is not None:
            from ray.util import remove_placement_group
            remove_placement_group(self.pg)
            self.pg = None
        self._rendezvous = None                     # its store stops with it
        ray.shutdown()


class HostedWorker:
    """An inference worker hosted by a Ray actor, where the supervisor keeps its processes."""

    def __init__(self, cluster: RayCluster, actor, bridged: bool, spec, pid: int, node: str,
                 pair=None) -> None:
        self.cluster, self.actor, self.bridged, self.spec, self.pid = cluster, actor, bridged, spec, pid
        self.node = node
        self.pair = pair                   # bridged: the gloo pair its weights go over
        self.sent = [0, 0, 0, 0.0]         # weights over the pair: versions, bytes, buckets, seconds
        self.name = f"arl-inference{spec.index}g{spec.gen}"
        self.exitcode: Optional[int] = None
        self.error = ""                    # why the worker is counted dead when it is not its exit
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump if bridged else self._watch,
                                        name=f"ray-pump{spec.index}", daemon=True)
        self._thread.start()

    # process-like
    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: Optional[float] = None) -> None:
        self._done.wait(timeout)

    def kill(self) -> None:
        ray = _ray()
        try:
            ray.get(self.actor.kill_worker.remote(), timeout=CALL_TIMEOUT_S)
        except Exception:
            ray.kill(self.actor)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(PUMP_JOIN_S)

    def _dead(self, code: int, why: str = "") -> None:
        if why:
            self.error = why
            log.error("inference worker %d: %s", self.spec.index, why)
        self.exitcode = code
        self._done.set()

    def _watch(self) -> None:
        ray = _ray()
        while not self._stop.wait(STATUS_S):
            try:
                code = ray.get(self.actor.status.remote(), timeout=CALL_TIMEOUT_S)
            except Exception as exc:
                return self._dead(LOST, self._gone(exc))
            if code is not None:
                return self._dead(code)

    def _pump(self) -> None:
        ray = _ray()
        res, i = self.cluster.res, self.spec.index
        req, out, ctl = res.inference_req[i], res.inference_out[i], res.inference_ctl[i]
        words = (res.heartbeats[("inference", i)], res.liveness[("inference", i)])
        bucket = self.cluster.cfg.placement.weight_bucket_mb << 20
        to_host = Frames("requests to the host")
        from_out, from_ctl = Frames("rollouts from the host"), Frames("control records from the host")
        carry: list = []              # records the supervisor's rings could not take yet
        pending = 0
        try:
            while not self._stop.is_set():
                frames, weights = [], -1      # weights: the LoadWeights version among the frames
                while pending == 0 and not carry and len(frames) < MAX_FRAMES:
                    try:
                        raw = req.get(timeout=0.0)
                    except TimeoutError:
                        break
                    frames.append(to_host.wrap(raw))
                    msg = messages.decode(raw)
                    if isinstance(msg, messages.LoadWeights) and res.weights.nbytes:
                        weights = msg.version
                        break
                call = self.actor.exchange.remote(frames, weights >= 0, 0.0 if carry else WAIT_S)
                if weights >= 0:              # the host receives them before it forwards the record
                    try:
                        t0 = time.monotonic()
                        _, nbytes, buckets = self.pair.send_latest(res.weights, weights, bucket)
                    except Exception as exc:
                        return self._dead(LOST, f"its weights over gloo to node {self.node[:12]} "
                                                f"failed ({type(exc).__name__}: {first_line(exc)})")
                    self.sent = [self.sent[0] + 1, self.sent[1] + nbytes, self.sent[2] + buckets,
                                 self.sent[3] + time.monotonic() - t0]
                try:
                    reply = ray.get(call, timeout=CALL_TIMEOUT_S)
                except ChannelError as exc:
                    return self._dead(LOST, f"its traffic was damaged or cut in transit: "
                                            f"{first_line(getattr(exc, 'cause', None) or exc)}")
                except Exception as exc:
                    return self._dead(LOST, self._gone(exc))
                pending = reply["pending"]
                carry += [(out, from_out.unwrap(f)) for f in reply["out"]]
                carry += [(ctl, from_ctl.unwrap(f)) for f in reply["ctl"]]
                carry = self._deliver(carry)
                now = now_ms()
                for word, age in zip(words, (reply["progress_age_ms"], reply["liveness_age_ms"])):
                    if age is not None:
                        word.set(max(1, now - age))
                if reply["exitcode"] is not None and not carry and not reply["out"] and not reply["ctl"]:
                    return self._dead(reply["exitcode"])
                if carry:                # the supervisor's ring is full: let the event loop read
                    self._stop.wait(CARRY_WAIT_S)
        except ChannelError as exc:
            self._dead(LOST, f"its records were damaged in transit: {exc}")
        except BaseException as exc:     # the pump is the worker's only link: without it, it is lost
            self._dead(LOST, f"its traffic stopped: {type(exc).__name__}: {first_line(exc)}")
        finally:
            if self.pair is not None:
                self.pair.close()
            versions, nbytes, buckets, took = self.sent
            log.info("inference worker %d (generation %d): %d weight versions over gloo, %.1f MB in "
                     "%d CRC-checked buckets, %.2f s sending", i, self.spec.gen, versions, nbytes / 1e6,
                     buckets, took)

    def _gone(self, exc: BaseException) -> str:
        return (f"its Ray host actor on node {self.node[:12]} is gone ({type(exc).__name__}: "
                f"{first_line(exc)})")

    def _deliver(self, carry: list) -> list:
        """Put records into the supervisor's rings in order; what does not fit now stays."""
        for n, (ring, data) in enumerate(carry):
            try:
                ring.put(data, timeout=0.0)
            except TimeoutError:
                self.cluster.res.bell.ring()
                return carry[n:]
            self.cluster.res.bell.ring()
        return []
