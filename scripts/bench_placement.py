"""The Ray path of `placement.mode: ray` against shared memory, measured in the same run.

    python scripts/bench_placement.py [--record-kb 64,1024] [--records 400] [--weights-mb 16,128]
                                      [--bucket-mb 16] [--rounds 3] [--address HOST:PORT]

Without `--address` it starts a cluster of its own on this machine (`ray.cluster_utils.Cluster`: a
head and a node with the custom resource `node_b`, bound to 127.0.0.1), so the host actor sits in
another raylet and every byte crosses Ray as it would between machines (but over loopback, so the
figure is Ray's overhead, not a network's). Two tables, medians and the min-max spread over rounds:

- rollouts: N records of K KiB from the rollout ring of an inference worker on node_b to the
  supervisor: a producer on node_b puts them into the ring its `WorkerHost` made (as the worker
  does), the driver pulls them with `exchange` calls and unwraps their frames (sequence and CRC-32
  checked), as `HostedWorker`'s pump does. Baseline: the same records through one shared-memory
  `Ring` from a producer process to this process (local mode). Figures: records/s, MB/s, ratio.
- weights: a published version of M MB from a shm weight buffer on the driver's side into node_b's
  weight buffer, as the pump sends it: the `exchange` that announces it is issued, the version goes
  over the host's gloo pair (`ray_weights`, buckets of `--bucket-mb`, CRC-32 checked, straight from
  the slot into the other node's slot), the exchange is awaited (the host has published it then).
  Baseline: a memcpy of the same bytes between two numpy arrays. Figures: ms per version, MB/s,
  ratio; two untimed versions first (every buffer's pages touched on both sides).
- steps (`--steps N`, 0: skipped): the default job (configs/default.yaml) launched for N steps in
  local mode and with `placement.mode=ray` on this cluster, its inference worker on node_b (records
  over Ray, weights over the gloo pair). Figures: steps/s from step 10 to step N (start-up
  excluded), read from each run's step lines, ray / local, and the seconds from launch to the first
  step line (start-up: a short run's average steps/s is mostly this), each round running both.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a driver of a 127.0.0.1 cluster
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from orchestrator.runtime.ray_host import Frames, WorkerHost  # noqa: E402
from orchestrator.runtime.resources import RingSizes, RunNames  # noqa: E402
from orchestrator.runtime.worker_base import WorkerSpec  # noqa: E402

now = time.perf_counter
STORE = 1 << 30            # each node's object store (the rollouts' Ray calls pass through it)


def _spread(xs: list) -> str:
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g})"


def shm_producer(name: str, n: int, nbytes: int) -> None:
    from shm.ring import Ring
    ring = Ring.attach(name)
    data = os.urandom(nbytes)
    for _ in range(n):
        ring.put(data, timeout=60.0)
    ring.close()


def shm_round(n: int, nbytes: int) -> float:
    """Seconds for n records of nbytes through one shm ring, producer process -> this one."""
    from shm.ring import Ring
    from shm.segments import segment_name
    ring = Ring.create(segment_name(f"{os.getpid()}-bench", "ring"),
                       max(64 << 20, 4 * Ring.record_space(nbytes)))
    try:
        p = mp.get_context("spawn").Process(target=shm_producer, args=(ring.name, n, nbytes))
        p.start()
        ring.get(timeout=60.0)               # the first record: the producer is running
        t0 = now()
        for _ in range(n - 1):
            ring.get(timeout=60.0)
        took = now() - t0
        p.join(30)
        return took
    finally:
        ring.close()
        ring.unlink()


def job_steps_per_s(run_dir: str, steps: int, extra: list[str]) -> tuple[float, float]:
    """(steps/s of the default job from step 10 to its last, by its step lines' time; seconds from
    the launch to its first step line)."""
    import json
    import subprocess
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.launch", f"run.dir={run_dir}",
                           f"run.total_steps={steps}", "run.progress=false", "run.checkpoint_every=0",
                           "eval.every_steps=0", *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the default job ({' '.join(extra) or 'local'}) failed: "
                           f"{proc.stderr.strip().splitlines()[-1:]}")
    lines = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    t = {r["step"]: r["time"] for r in lines if r.get("kind") == "step"}
    return (steps - 10) / (t[steps] - t[10]), t[1] - start


def steps_table(address: str, steps: int, rounds: int) -> None:
    import tempfile
    ray_mode = ["placement.mode=ray", f"placement.ray_address={address}",
                "placement.inference_resources={node_b: 1}"]
    local, remote = [], []
    with tempfile.TemporaryDirectory(prefix="bench-placement-") as tmp:
        for r in range(rounds):
            local.append(job_steps_per_s(f"{tmp}/local{r}", steps, []))
            remote.append(job_steps_per_s(f"{tmp}/ray{r}", steps, ray_mode))
    rate = lambda runs: [r[0] for r in runs]    # noqa: E731
    first = lambda runs: [r[1] for r in runs]   # noqa: E731
    print(f"\nsteps: the default job, steps 10-{steps}, inference on node_b (ray) vs local mode; "
          f"seconds from launch to the first step line")
    print("| local steps/s | ray steps/s | ray / local | local first step s | ray first step s |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {_spread(rate(local))} | {_spread(rate(remote))} | "
          f"{_spread([a / b for a, b in zip(rate(remote), rate(local))])} | {_spread(first(local))} | "
          f"{_spread(first(remote))} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record-kb", default="64,1024")
    ap.add_argument("--records", type=int, default=400)
    ap.add_argument("--weights-mb", default="16,128")
    ap.add_argument("--bucket-mb", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--address", default=None)
    ap.add_argument("--steps", type=int, default=0, help="steps of the default job per mode (>= 20)")
    args = ap.parse_args()
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    cluster = None
    if args.address is None:
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1",
            "object_store_memory": STORE})
        cluster.add_node(num_cpus=2, resources={"node_b": 2}, node_ip_address="127.0.0.1",
                         object_store_memory=STORE)
        cluster.wait_for_nodes()
        args.address = cluster.address
    ray.init(address=args.address, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        node_b = next(n["NodeID"] for n in ray.nodes()
                      if n.get("Alive") and n["Resources"].get("node_b"))
        there = NodeAffinitySchedulingStrategy(node_b, soft=False)
        kbs = [int(x) for x in args.record_kb.split(",") if x]
        mbs = [int(x) for x in args.weights_mb.split(",") if x]
        biggest = max([k << 10 for k in kbs] + [1])
        sizes = RingSizes(out=max(64 << 20, 8 * (biggest + 64)))
        nbytes = max([m << 20 for m in mbs] + [8])
        host = ray.remote(WorkerHost).options(scheduling_strategy=there, num_cpus=1).remote(True)
        spec = WorkerSpec("inference", 0, RunNames("bench", 1), {}, os.getpid(), str(ROOT))
        spec = ray.get(host.prepare.remote(spec, sizes, nbytes), timeout=120)

        @ray.remote(num_cpus=1)
        def produce(ring_name: str, bell_name: str, n: int, size: int) -> None:
            from shm.ring import Ring
            from orchestrator.wire import Bell
            ring, bell = Ring.attach(ring_name), Bell.attach(bell_name)
            data = os.urandom(size)
            for _ in range(n):
                ring.put(data, timeout=60.0)
                bell.ring()
            ring.close()
            bell.close()

        print("rollouts: N records of K KiB, node_b -> the supervisor; median (min-max) over rounds")
        print("| K KiB | Ray path records/s | MB/s | shm ring records/s | MB/s | Ray / shm |")
        print("| --- | --- | --- | --- | --- | --- |")
        frames_got = Frames("rollouts from the host")
        for kb in kbs:
            size, n = kb << 10, args.records
            ray_s, shm_s = [], []
            for _ in range(args.rounds):
                done = produce.options(scheduling_strategy=there).remote(
                    spec.names.out(0, 0), spec.names.bell, n, size)
                got, t0 = 0, None
                while got < n:
                    reply = ray.get(host.exchange.remote([], False, 0.05), timeout=60)
                    for f in reply["out"]:
                        frames_got.unwrap(f)
                        got += 1
                        if t0 is None:          # timed from the first record, as the shm round
                            t0 = now()
                ray_s.append(now() - t0)
                ray.get(done, timeout=60)
                shm_s.append(shm_round(n, size))
            rates = [(n - 1) / s for s in ray_s]
            base = [(n - 1) / s for s in shm_s]
            mb = lambda r: [x * size / 1e6 for x in r]   # noqa: E731
            print(f"| {kb} | {_spread(rates)} | {_spread(mb(rates))} | {_spread(base)} | "
                  f"{_spread(mb(base))} | {_spread([a / b for a, b in zip(rates, base)])} |")

        print(f"\nweights: one version of M MB into node_b's weight buffer over gloo (buckets of "
              f"{args.bucket_mb} MiB) vs a memcpy of the bytes")
        print("| M MB | gloo ms | MB/s | memcpy ms | gloo / memcpy |")
        print("| --- | --- | --- | --- | --- |")
        from orchestrator.runtime.ray_weights import Rendezvous
        from shm.segments import segment_name
        from shm.weights import WeightBuffer
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        rdv = Rendezvous(ips[ray.get_runtime_context().get_node_id()], 60.0)
        joined = host.pair.remote(rdv.ip, rdv.port, "bench", ips[node_b], 60.0)
        pair = rdv.pair("bench")
        ray.get(joined, timeout=120)
        wbuf = WeightBuffer.create(segment_name(f"{os.getpid()}-bench", "weights"), nbytes)
        version = 0
        try:
            for mb_ in mbs:
                size = mb_ << 20
                src = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
                dst = np.empty_like(src)
                gloo_ms, copy_ms = [], []
                for r in range(-2, args.rounds):  # two untimed rounds: both slots and dst touched
                    version += 1
                    src[:8] = version             # a version's fresh bytes
                    wbuf.publish(src, version)
                    t0 = now()
                    call = host.exchange.remote([], True, 0.0)
                    pair.send_latest(wbuf, version, args.bucket_mb << 20)
                    ray.get(call, timeout=120)
                    took = (now() - t0) * 1e3
                    t0 = now()
                    np.copyto(dst, src)
                    if r >= 0:
                        gloo_ms.append(took)
                        copy_ms.append((now() - t0) * 1e3)
                print(f"| {mb_} | {_spread(gloo_ms)} | {_spread([size / 1e3 / x for x in gloo_ms])} | "
                      f"{_spread(copy_ms)} | {_spread([a / b for a, b in zip(gloo_ms, copy_ms)])} |")
        finally:
            pair.close()
            wbuf.close()
            wbuf.unlink()
        ray.get(host.close.remote(), timeout=60)
        if args.steps:
            steps_table(args.address, max(args.steps, 20), args.rounds)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
