"""`placement.mode: ray` (issue #27) on one machine: a Ray cluster of a head and a second node
(`ray.cluster_utils.Cluster`, bound to 127.0.0.1), the inference workers placed on the second node
by a custom resource, so their records travel over Ray, not shared memory. The run keeps its
promises there: every step, the age bound, every prompt trained exactly once (the audit), a killed
remote worker restarted (with a new gloo pair for its weights), SIGTERM bounded with no actor or
worker left, a driver killed with SIGKILL taking its actors and workers with it and resuming
exactly; a placement the cluster cannot hold, or no cluster at the address, is exit 2 in one line
before any worker starts."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.integration.lifecycle import (ROOT, all_gone, error_lines, run, run_embedded, start,
                                         steps, wait_for_step, worker_pids)

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

# On Linux a driver resolves 127.0.0.1 to the machine's address (to be reachable from other
# nodes); a cluster bound to 127.0.0.1 only is reached with Ray's loopback setting. The runs set it
# themselves (orchestrator.runtime.ray_connect); the tests' own drivers are given it.
LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = {LOOPBACK_VAR: "0"}
SLOW = ["inference.sim.latency_s=0.05", "actor.sim.step_time_s=0.06"]


@pytest.fixture(autouse=True)
def _no_loopback_setting(monkeypatch):
    """The runs get nothing of Ray's loopback setting from the tests' environment."""
    monkeypatch.delenv(LOOPBACK_VAR, raising=False)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"head": 1}, "include_dashboard": False,
        "node_ip_address": "127.0.0.1"})
    c.add_node(num_cpus=2, resources={"node_b": 2}, node_ip_address="127.0.0.1")
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _placed(cluster):
    """The overrides of a run whose inference workers go to node_b of `cluster`."""
    return ["placement.mode=ray", f"placement.ray_address={cluster.address}",
            "placement.inference_resources={node_b: 1}"]


def _start(cluster, run_dir, *overrides):
    return start(run_dir, *_placed(cluster), "rollout.filter_zero_std=false", *overrides)


def _run(cluster, run_dir, *overrides, timeout=180):
    return run(run_dir, *_placed(cluster), "rollout.filter_zero_std=false", *overrides,
               timeout=timeout)


def _gloo(log: str) -> dict:
    """(worker, generation) -> weight versions its pump sent over its gloo pair (its last log line)."""
    import re
    pat = r"inference worker (\d+) \(generation (\d+)\): (\d+) weight versions over gloo"
    return {(int(w), int(g)): int(n) for w, g, n in re.findall(pat, log)}


def _audit(run_dir):
    out = subprocess.run([sys.executable, "-m", "orchestrator.audit", str(run_dir)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def _hosts():
    """Live processes of Ray actors hosting inference workers (Ray names them ray::WorkerHost)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any("WorkerHost" in part for part in p.info["cmdline"] or ()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def _gone(pids, timeout):
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return all_gone(procs, timeout) == []


def test_workers_on_another_node_keep_every_promise(cluster, tmp_path):
    out = _run(cluster, tmp_path, "run.total_steps=30", "rollout.max_observed_offpolicyness=2")
    assert out.returncode == 0, out.stderr[-3000:]
    log = (tmp_path / "logs" / "supervisor.log").read_text()
    assert log.count("records over Ray (another node)") == 2, log
    assert log.count("weights over gloo from 127.0.0.1:") == 2, log
    sent = _gloo(log)
    assert sorted(sent) == [(0, 0), (1, 0)] and all(n > 0 for n in sent.values()), sent
    s = steps(tmp_path)
    assert [r["step"] for r in s] == list(range(1, 31))
    assert max(r["age_max"] for r in s) <= 2        # the hard bound (the gate alone allows S + 1)
    assert sum(r["weight_sync_s"] is not None for r in s) > 0
    audit = _audit(tmp_path)
    assert audit["ok"], audit["failures"]
    assert _gone(worker_pids(tmp_path).values(), 10) and _hosts() == []


def test_a_worker_on_the_driver_s_node_keeps_the_shm_rings(cluster, tmp_path):
    out = _run(cluster, tmp_path, "run.total_steps=20", "inference.num_workers=1",
               "placement.inference_resources={head: 1}")
    assert out.returncode == 0, out.stderr[-3000:]
    log = (tmp_path / "logs" / "supervisor.log").read_text()
    assert "inference worker 0: bundle 0 on node" in log and "shm rings (the driver's node)" in log
    assert "records over Ray" not in log and "over gloo" not in log
    audit = _audit(tmp_path)
    assert audit["ok"], audit["failures"]
    assert _gone(worker_pids(tmp_path).values(), 10) and _hosts() == []


@pytest.mark.parametrize("victim, workers", [("worker", 2), ("host", 1)])
def test_a_killed_remote_worker_is_restarted_and_nothing_is_lost(cluster, tmp_path, victim, workers):
    """kill -9 of a remote worker (the other worker carries on) or of its host actor (the only
    worker: the run cannot end without its restart, whose new gloo pair carries its weights)."""
    proc = _start(cluster, tmp_path, "run.total_steps=40", f"inference.num_workers={workers}", *SLOW)
    wait_for_step(proc, tmp_path, 5, timeout=120)
    victim_pid = worker_pids(tmp_path)["inference0"]
    if victim == "host":
        hosts = _hosts()
        assert len(hosts) == 1, hosts
        hosts[0].kill()
    else:
        os.kill(victim_pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    events = [json.loads(line) for line in open(tmp_path / "metrics.jsonl") if '"event"' in line]
    assert [(e["event"], e["worker"]) for e in events] == [("worker_restart", 0)]
    assert worker_pids(tmp_path)["inference0"] != victim_pid
    log = (tmp_path / "logs" / "supervisor.log").read_text()
    assert log.count("weights over gloo from") == workers + 1, log    # the restart's new pair
    sent = _gloo(log)
    assert sent.get((0, 0), 0) > 0 and (0, 1) in sent, sent
    if workers == 1:
        assert sent[(0, 1)] > 0, sent
    audit = _audit(tmp_path)
    assert audit["ok"], audit["failures"]
    assert _hosts() == []


def test_sigterm_is_bounded_and_leaves_no_actor_or_worker(cluster, tmp_path):
    proc = _start(cluster, tmp_path, "run.total_steps=100000", "run.shutdown_timeout_s=6", *SLOW)
    wait_for_step(proc, tmp_path, 3, timeout=120)
    workers = list(worker_pids(tmp_path).values())
    assert len(_hosts()) == 2
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM
    assert took <= 6 + 2, took
    assert _gone(workers, 5) and _hosts() == []
    groups = _placement_groups(cluster)
    assert groups and all(state == "REMOVED" for state in groups.values()), groups


def _placement_groups(cluster) -> dict:
    """name -> state of the cluster's placement groups of runs (asked by a driver of its own)."""
    code = ("import json, logging, ray; from ray.util import placement_group_table; "
            f"ray.init(address={cluster.address!r}, log_to_driver=False, "
            "logging_level=logging.ERROR); "
            "print(json.dumps({g['name']: g['state'] for g in placement_group_table().values() "
            "if g['name'].startswith('arl-')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **LOOPBACK})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_driver_killed_with_sigkill_takes_its_actors_and_resumes_exactly(cluster, tmp_path):
    proc = _start(cluster, tmp_path, "run.total_steps=40", "run.resume=auto",
                  "run.checkpoint_every=5", *SLOW)
    wait_for_step(proc, tmp_path, 12, timeout=120)
    workers = [pid for name, pid in worker_pids(tmp_path).items() if name.startswith("inference")]
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(workers, 30), "a remote inference worker outlived its driver"
    deadline = time.monotonic() + 30
    while _hosts() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _hosts() == [], "a host actor outlived its driver"
    out = _run(cluster, tmp_path, "run.total_steps=40", "run.resume=auto", "run.checkpoint_every=5")
    assert out.returncode == 0, out.stderr[-3000:]
    s = steps(tmp_path)
    assert [r["step"] for r in s][-1] == 40
    audit = _audit(tmp_path)
    assert audit["ok"], audit["failures"]


@pytest.mark.parametrize("overrides, named", [
    (["placement.inference_resources={node_c: 1}"], "node_c"),
    (["inference.num_workers=3"], "node_b"),
])
def test_a_placement_the_cluster_cannot_hold_is_exit_2(cluster, tmp_path, overrides, named):
    out = _run(cluster, tmp_path, *overrides)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and named in lines[0] and "placement" in lines[0], out.stderr
    assert not (tmp_path / "logs" / "inference0.log").exists()
    assert _hosts() == []


def test_no_cluster_at_the_address_is_exit_2(tmp_path):
    out = run(tmp_path, "placement.mode=ray", "placement.ray_address=127.0.0.1:9")
    assert out.returncode == 2, out.stderr[-2000:]
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and "placement.ray_address=127.0.0.1:9" in lines[0], out.stderr


def test_the_readme_command_joins_a_loopback_cluster_with_nothing_set(cluster, tmp_path):
    """The README's command (configs/default.yaml, the torch job) against a cluster on 127.0.0.1,
    no environment variable set: it used to wait in ray.init without end (0 steps, an empty
    supervisor.log), Ray's driver turning 127.0.0.1 into this machine's address, where the cluster
    does not listen. The run joins as 127.0.0.1 and says so in one line."""
    out = run(tmp_path, *_placed(cluster), "run.total_steps=20", config="configs/default.yaml",
              timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in steps(tmp_path)] == list(range(1, 21))
    log = (tmp_path / "logs" / "supervisor.log").read_text()
    joined = [line for line in log.splitlines() if "joins it as 127.0.0.1" in line]
    assert len(joined) == 1 and f"{cluster.address} is loopback" in joined[0], log
    assert "records over Ray (another node)" in log


@pytest.fixture
def deaf_listener():
    """host:port of a socket that accepts connections and never answers (no GCS behind it)."""
    import socket
    import threading
    srv = socket.create_server(("127.0.0.1", 0))
    conns, done = [], threading.Event()

    def accept():                       # owned by the fixture, ended by its teardown
        srv.settimeout(0.2)
        while not done.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    done.set()
    t.join(5)
    for c in conns:
        c.close()
    srv.close()


def _hold(cluster, resources: dict):
    """A driver of the test's own holding a placement group of `resources` until killed."""
    code = ("import logging, sys, time, ray; from ray.util import placement_group; "
            f"ray.init(address={cluster.address!r}, log_to_driver=False, "
            "logging_level=logging.ERROR); "
            f"pg = placement_group([{resources!r}]); ray.get(pg.ready(), timeout=60); "
            "print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, **LOOPBACK})
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.parametrize("wait", ["ray.init", "placement group"])
def test_a_wait_on_the_cluster_past_ray_timeout_s_is_exit_1_naming_it(cluster, tmp_path, wait,
                                                                     request):
    """ray.init against an address that accepts connections but never answers, and a placement
    group the cluster could hold but whose resources another driver holds: each is exit 1 within
    placement.ray_timeout_s (+ the launch's own start) in one line naming the wait (today's code
    waited in ray.init without end; the group's wait was exit 2)."""
    holder = None
    if wait == "ray.init":
        deaf = request.getfixturevalue("deaf_listener")
        overrides = ["placement.mode=ray", f"placement.ray_address={deaf}"]
    else:
        holder = _hold(cluster, {"node_b": 2})
        overrides = _placed(cluster)
    try:
        t0 = time.monotonic()
        out = run(tmp_path, *overrides, "placement.ray_timeout_s=5", timeout=120)
        took = time.monotonic() - t0
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(30)
    assert out.returncode == 1, out.stderr[-2000:]
    assert took < 5 + 30, took
    lines = error_lines(out.stderr)
    assert len(lines) == 1 and wait in lines[0] and "placement.ray_timeout_s=5" in lines[0], out.stderr
    assert not (tmp_path / "logs" / "inference0.log").exists()
    assert _hosts() == []


def _node_of_worker(cluster, run_dir, i):
    """The cluster's node object hosting inference worker i (from the supervisor's log)."""
    import re
    log = (run_dir / "logs" / "supervisor.log").read_text()
    short = re.findall(rf"inference worker {i}: bundle {i} on node ([0-9a-f]+)", log)[-1]
    return next(n for n in cluster.list_all_nodes() if n.node_id.startswith(short)), short


def test_a_lost_node_s_worker_restarts_on_the_remaining_node(cluster, tmp_path):
    spares = [cluster.add_node(num_cpus=1, resources={"spare": 1}, node_ip_address="127.0.0.1")
              for _ in range(2)]
    cluster.wait_for_nodes()
    try:
        proc = _start(cluster, tmp_path, "run.total_steps=40", "inference.num_workers=1",
                      "placement.inference_resources={spare: 1}", *SLOW)
        wait_for_step(proc, tmp_path, 5, timeout=120)
        node, short = _node_of_worker(cluster, tmp_path, 0)
        cluster.remove_node(node, allow_graceful=False)
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        events = [json.loads(line) for line in open(tmp_path / "metrics.jsonl") if '"event"' in line]
        assert [(e["event"], e["worker"]) for e in events] == [("worker_restart", 0)]
        _, now = _node_of_worker(cluster, tmp_path, 0)
        assert now != short
        audit = _audit(tmp_path)
        assert audit["ok"], audit["failures"]
    finally:
        for n in spares:
            if n in cluster.worker_nodes:
                cluster.remove_node(n)


@pytest.mark.parametrize("death, named", [
    ("restart", "placement.ray_timeout_s=10"),          # no bundle placed again in time
    ("fail", "inference.on_worker_death=fail"),          # the worker's death fails the run
])
def test_a_lost_node_with_no_room_elsewhere_fails_the_run_naming_it(cluster, tmp_path, death, named):
    solo = cluster.add_node(num_cpus=1, resources={"solo": 1}, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    try:
        proc = _start(cluster, tmp_path, "run.total_steps=100000", "inference.num_workers=1",
                      "placement.inference_resources={solo: 1}", "placement.ray_timeout_s=10",
                      f"inference.on_worker_death={death}", *SLOW)
        wait_for_step(proc, tmp_path, 3, timeout=120)
        workers = list(worker_pids(tmp_path).values())
        _, short = _node_of_worker(cluster, tmp_path, 0)
        cluster.remove_node(solo, allow_graceful=False)
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 1, err[-3000:]
        lines = error_lines(err)
        assert len(lines) == 1 and short in lines[0] and named in lines[0], err
        assert _gone(workers, 10) and _hosts() == []
    finally:
        if solo in cluster.worker_nodes:
            cluster.remove_node(solo)


def test_the_default_job_learns_with_its_inference_on_another_node(cluster, tmp_path):
    """The embedded default job (torch backends) with its inference worker on the second node
    learns within test_default_learns's bounds (the same job in local mode)."""
    import numpy as np
    cfg, _, s = run_embedded(tmp_path, overrides=_placed(cluster))
    log = (tmp_path / "logs" / "supervisor.log").read_text()
    assert "records over Ray (another node)" in log and "weights over gloo from" in log
    sent = _gloo(log)
    assert sent and all(n > 0 for n in sent.values()), sent
    rewards = np.array([r["reward_mean"] for r in s])
    first, last = rewards[:10].mean(), rewards[-10:].mean()
    assert last >= 0.7 and last - first >= 0.5, (first, last)
    assert np.mean([r["age_mean"] for r in s]) <= cfg["rollout"]["max_head_offpolicyness"]
    assert max(r["logprob_diff_mean"] or 0.0 for r in s) < 1e-3   # the weights arrived whole
