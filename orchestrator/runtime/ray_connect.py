"""The driver joins the Ray cluster of `placement.mode: ray`: every wait bounded, loopback handled.

`join(place, root, check) -> str` (the cluster's address as Ray was given it), called by
`ray_cluster.RayCluster.connect` before anything of the run starts:

1. The address: `auto` is what Ray finds on this machine (RAY_ADDRESS, then the cluster `ray start`
   recorded), else `placement.ray_address`; something must accept a TCP connection there within
   `PROBE_S` (ray.init would retry for minutes): exit 2 otherwise.
2. Loopback: on Linux Ray's driver turns a loopback bootstrap address (127.0.0.1, localhost) into
   this machine's address (`ray._private.services.resolve_ip_for_localhost` ->
   `get_node_ip_address`: the interface a packet to the internet would leave from) and registers
   itself with that IP, unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (read once, when Ray is imported,
   into `ray_constants.ENABLE_RAY_CLUSTER`). A cluster started on 127.0.0.1 (`ray.cluster_utils.
   Cluster(node_ip_address="127.0.0.1")`, `ray start --node-ip-address=127.0.0.1`) listens on
   127.0.0.1 only, so `ray.init` waited in Ray's GcsClient for a GCS at e.g. 192.0.2.2:port that never
   answers: without end, nothing logged (issue #38). So when the address is loopback, answers there
   and does not answer at the address Ray would turn it into, the driver joins as 127.0.0.1 (that
   setting made for this process, in its environment and in Ray's constant) and says so in one log
   line; a user's own RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is left as it is.
3. `ray.init` runs in a thread of its own (Ray's call has no timeout; a GcsClient that cannot reach
   its GCS waits in C++, where no signal reaches it) that this call waits for, `check()` called
   every `TICK_S` (the supervisor's stop check: a SIGTERM meanwhile raises there). Not joined
   within `placement.ray_timeout_s`: `RunFailed(..., 1)` in one line naming the wait
   ("ray.init(address=...) did not return within placement.ray_timeout_s=..."); the thread is left
   in Ray's call (Ray offers no way to cancel it; it is a daemon and ends with the process, which
   exits 1 next). A refusal Ray raises (versions differ, no cluster) is exit 2 with Ray's reason.
   Ray is not given the main thread, so it installs no SIGTERM handler of its own: the run's stay.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time
from typing import Callable

from orchestrator.errors import RunFailed

log = logging.getLogger("orchestrator.runtime.ray_connect")
PROBE_S = 5.0          # the cluster's address must accept a connection within this
TICK_S = 0.1           # the stop check while ray.init runs
LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def join(place, root: str, check: Callable[[], None] = lambda: None) -> str:
    import ray
    address = _address(ray, place.ray_address)
    host, _, port = address.rpartition(":")
    _probe(place.ray_address, address, min(PROBE_S, place.ray_timeout_s))
    _loopback(ray, host, port)
    kwargs = dict(address=address, log_to_driver=False, logging_level=logging.WARNING,
                  namespace="arl", runtime_env={"env_vars": {"PYTHONPATH": root}})
    got: dict = {}

    def init() -> None:
        try:
            with _quiet():
                ray.init(**kwargs)
            got["ok"] = True
        except BaseException as exc:          # re-raised by the waiting thread
            got["error"] = exc

    thread = threading.Thread(target=init, name="ray-init", daemon=True)
    thread.start()
    deadline = time.monotonic() + place.ray_timeout_s
    while thread.is_alive() and time.monotonic() < deadline:
        check()
        thread.join(TICK_S)
    if thread.is_alive():
        went = _resolved(host, port)
        went = f", which Ray turned into {went}" if went != address else ""
        raise RunFailed(f"placement: ray.init(address={address}{went}) did not return within "
                        f"placement.ray_timeout_s={place.ray_timeout_s:g} (the Ray cluster at "
                        f"{place.ray_address} accepts connections but its GCS did not answer "
                        f"this driver)", 1)
    exc = got.get("error")
    if isinstance(exc, (ConnectionError, RuntimeError, ValueError)):
        raise RunFailed(f"placement.ray_address={place.ray_address}: cannot join the Ray cluster "
                        f"({_first_line(exc) or type(exc).__name__})", 2) from None
    if exc is not None:
        raise exc
    return address


def _address(ray, address: str) -> str:
    if address != "auto":
        return address
    try:
        found = ray._private.services.get_ray_address_from_environment("auto", None)
    except Exception:
        found = None
    if not found or found == "auto":
        raise RunFailed("placement.ray_address=auto: no Ray cluster runs on this machine "
                        "(start one with `ray start --head`, or name its host:port)", 2)
    return found


def _probe(given: str, address: str, timeout_s: float) -> None:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise RunFailed(f"placement.ray_address={given}: no Ray cluster answers at {address} "
                        f"({type(exc).__name__}: {exc})", 2) from None


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback(ray, host: str, port: str) -> None:
    """Join a cluster that listens on loopback only as 127.0.0.1 (see the module's point 2)."""
    from ray._private import ray_constants, services
    if not _is_loopback(host) or LOOPBACK_VAR in os.environ or not ray_constants.ENABLE_RAY_CLUSTER:
        return
    mine = services.resolve_ip_for_localhost(host)       # where ray.init would go
    if _is_loopback(mine):
        return
    try:
        socket.create_connection((mine, int(port)), timeout=1.0).close()
        return                               # the cluster answers at this machine's address too
    except OSError:
        pass
    os.environ[LOOPBACK_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    log.info("placement.ray_address=%s:%s is loopback and the cluster listens there only (not at "
             "%s:%s, where Ray would go): this driver joins it as 127.0.0.1 (%s=0 for this process)",
             host, port, mine, port, LOOPBACK_VAR)


def _resolved(host: str, port: str) -> str:
    from ray._private import services
    try:
        return f"{services.resolve_ip_for_localhost(host)}:{port}"
    except Exception:
        return f"{host}:{port}"


class _quiet:
    """Drops Ray's one warning that ray.init runs outside the main thread (deliberate here)."""

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "not the main thread" not in record.getMessage()

    def __enter__(self):
        self.filter = self._Filter()
        self.logger = logging.getLogger("ray._private.worker")
        self.logger.addFilter(self.filter)

    def __exit__(self, *exc):
        self.logger.removeFilter(self.filter)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
