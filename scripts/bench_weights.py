"""The CPU weight path against one memcpy of the same bytes, measured in the same run.

    python scripts/bench_weights.py [--sizes-mb 100,1024,4096] [--rounds 3] [--skip-create]
    python scripts/bench_weights.py --sizes-mb '' --cuda-params 1.5e9 [--json OUT]    # a GPU

Two tables, each with medians, the spread (min-max) over rounds and the ratio to a copy of N bytes
between two preallocated numpy arrays (pages touched; the baseline, timed in the same round):

- create: a `shm.weights.WeightBuffer` of N bytes allocates two N-byte slots in /dev/shm up front
  (so a full /dev/shm fails at creation, not with SIGBUS mid-run), by one posix_fallocate call;
  before, every page was touched from Python (18.5 s for 4 GB).
- hand-off: a writer publishes N bytes; a reader in another process (spawned) reads them straight
  into its own weights, as the CPU torch inference backend does (its parameters live in one flat
  buffer in the trainer's layout, so the read is the only copy on its side).
  `streamed`: the reader asks for the version being published and copies behind the writer, chunk
  by chunk; the figure is publish start -> reader has every byte (one copy's time if the two
  overlap). `reload`: the reader starts after the publish, as an inference worker does when its
  LoadWeights arrives; the figure is the reader's stall, reload start -> done (one copy).

Two baselines per size: `memcpy` between numpy arrays as numpy allocates them (transparent huge
pages where the kernel gives them) and `memcpy4K`, the same copy from a source on 4 KiB pages, as
/dev/shm maps its pages unless `/sys/kernel/mm/transparent_hugepage/shmem_enabled` allows huge ones
(the script prints that setting). Reading from 4 KiB pages costs about 3x on a VM with nested paging
(seen here), whatever copies: that is the floor of a hand-off through /dev/shm. Ratios are printed
against both.

`--cuda-params N`: the GPU path, CUDA IPC within one device, for a random bf16 model of N
parameters (2N bytes; 1.5e9: a 1.5B model). The trainer side publishes through
`shm.cuda_ipc.CudaIpcPublisher` (a fresh random fill each round, buffers released once the reader
acknowledged, as the trainer worker does); a reader in another (spawned) process opens the blob with
`open_blob` and copies it into its own weights, as the torch inference backend does on reload. The
figure is the reader's stall, open -> copied and synchronised (ms per reload, GB/s), against a
device-to-device copy of the same bytes in one process (`copy_`, the floor). `--json OUT` writes
every figure to OUT (scripts/gpu_check.sh reads it).
"""
from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from shm.weights import WeightBuffer  # noqa: E402

now = time.perf_counter                       # CLOCK_MONOTONIC: comparable across processes


def reader(name: str, conn) -> None:
    wbuf = WeightBuffer.attach(name)
    target = np.ones(wbuf.nbytes, np.uint8)     # "the weights", every page touched
    while (msg := conn.recv()) is not None:
        version = msg
        conn.send("ready")
        t0 = now()
        got = wbuf.read_into(target, timeout=120, min_version=version)
        conn.send((got, t0, now()))
    wbuf.close()


def spread(xs: list[float]) -> str:
    return f"({min(xs):.3f}-{max(xs):.3f})"


def row(label: str, xs: list[float], base: list[float], base4k: list[float]) -> str:
    out = f"{label:>16s} {statistics.median(xs):9.3f} {spread(xs):>15s}"
    for b in (base, base4k):
        ratios = [x / y for x, y in zip(xs, b)]
        out += (f" {statistics.median(b):9.3f} {spread(b):>15s} {statistics.median(ratios):7.2f} "
                f"{f'({min(ratios):.2f}-{max(ratios):.2f})':>13s}")
    return out


def source_4k(n: int) -> np.ndarray:
    """n bytes on 4 KiB pages (an anonymous mapping numpy does not madvise for huge pages)."""
    a = np.frombuffer(mmap.mmap(-1, n), np.uint8)
    a[:] = 1
    return a


def memcpy_s(dst: np.ndarray, src: np.ndarray) -> float:
    t = now()
    np.copyto(dst, src)
    return now() - t


def handoff(n: int, rounds: int, src: np.ndarray, bases) -> tuple[list, list, list, list]:
    """Per round: (streamed s, reload s, memcpy s, memcpy 4K s); `bases`: the two (dst, src)."""
    name = f"arl_bench{os.getpid()}_hand{n}"
    wbuf = WeightBuffer.create(name, n)
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=reader, args=(name, theirs), daemon=True)
    proc.start()
    streamed, reload, copy, copy4k = [], [], [], []
    version = 0
    try:
        for _ in range(rounds):
            version += 1                        # streamed: the reader waits for this version
            ours.send(version)
            assert ours.recv() == "ready"
            t0 = now()
            wbuf.publish(src, version)
            got, _, t1 = ours.recv()
            assert got == version
            streamed.append(t1 - t0)
            version += 1                        # reload: published first, then read
            wbuf.publish(src, version)
            ours.send(version)
            assert ours.recv() == "ready"
            got, r0, r1 = ours.recv()
            assert got == version
            reload.append(r1 - r0)
            copy.append(memcpy_s(*bases[0]))
            copy4k.append(memcpy_s(*bases[1]))
        ours.send(None)
        proc.join(timeout=60)
    finally:
        if proc.is_alive():
            proc.kill()
        wbuf.close()
        wbuf.unlink()
    return streamed, reload, copy, copy4k


def cuda_reader(nbytes: int, conn) -> None:
    import torch
    from shm.cuda_ipc import open_blob
    weights = torch.zeros(nbytes, dtype=torch.uint8, device="cuda:0")    # the reader's own weights
    torch.cuda.synchronize()
    conn.send("ready")
    while (blob := conn.recv()) is not None:
        t0 = now()
        version, src = open_blob(blob, 0)
        weights.copy_(src)
        torch.cuda.synchronize()
        t1 = now()
        del src
        conn.send((version, t0, t1, int(weights[-1])))


def cuda_handoff(params: float, rounds: int) -> dict:
    """CUDA IPC reload of 2 x params bytes (bf16) against a device-to-device copy of the same bytes."""
    import torch
    from shm.cuda_ipc import CudaIpcPublisher
    n = int(params) * 2
    gen = torch.Generator(device="cuda:0").manual_seed(0)
    model = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:0", generator=gen)
    dst = torch.empty_like(model)
    pub = CudaIpcPublisher("cuda:0")
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=cuda_reader, args=(n, theirs), daemon=True)
    proc.start()
    publish, reload, d2d = [], [], []
    try:
        if not ours.poll(300):
            raise SystemExit("bench_weights: the CUDA reader did not start within 300 s")
        assert ours.recv() == "ready"
        for version in range(1, rounds + 2):                 # version 1: warm-up (handle mapping)
            model.add_(1)                                    # the trainer's step changed the weights
            t0 = now()
            blob = pub.publish(version, n, lambda buf: buf.copy_(model))
            t_pub = now() - t0
            ours.send(blob)
            if not ours.poll(300):
                raise SystemExit(f"bench_weights: no reload of version {version} within 300 s")
            got, r0, r1, last = ours.recv()
            assert got == version and last == int(model[-1]), "the reader got other bytes"
            pub.release_below(version)
            torch.cuda.synchronize()
            t0 = now()
            dst.copy_(model)
            torch.cuda.synchronize()
            if version > 1:
                publish.append(t_pub)
                reload.append(r1 - r0)
                d2d.append(now() - t0)
        ours.send(None)
        proc.join(timeout=60)
    finally:
        if proc.is_alive():
            proc.kill()
    med = statistics.median
    return {"params": int(params), "bytes": n, "rounds": rounds, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "reload_ms": med(reload) * 1e3,
            "reload_ms_min_max": [min(reload) * 1e3, max(reload) * 1e3],
            "reload_gb_s": n / med(reload) / 1e9, "publish_ms": med(publish) * 1e3,
            "d2d_ms": med(d2d) * 1e3, "d2d_gb_s": n / med(d2d) / 1e9,
            "reload_over_d2d": med([r / d for r, d in zip(reload, d2d)])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="100,1024,4096", help="CPU hand-off sizes ('' for none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-create", action="store_true")
    ap.add_argument("--cuda-params", type=float, default=None, metavar="N",
                    help="also the CUDA IPC reload of a random bf16 model of N parameters")
    ap.add_argument("--json", default=None, metavar="OUT", help="write every figure to OUT")
    args = ap.parse_args(argv)
    if args.cuda_params is not None:
        import torch
        if not torch.cuda.is_available():
            print(f"bench_weights: --cuda-params needs a CUDA device; torch {torch.__version__} sees none",
                  file=sys.stderr)
            return 2
    report: dict = {"cpu": []}
    try:
        shmem = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text().strip()
    except OSError:
        shmem = "unknown"
    print(f"/dev/shm huge pages (shmem_enabled): {shmem}")
    cols = f"{'memcpy s':>9s} {'(min-max)':>15s} {'ratio':>7s} {'(min-max)':>13s}"
    print(f"{'':>16s} {'s':>9s} {'(min-max)':>15s} {cols} {cols.replace('memcpy s', 'memcpy4K')}")
    for mb in (int(x) for x in args.sizes_mb.split(",") if x.strip()):
        n = mb << 20
        src, dst = np.ones(n, np.uint8), np.zeros(n, np.uint8)
        src4k = source_4k(n)
        bases = ((dst, src), (dst, src4k))
        if not args.skip_create:
            create, copy, copy4k = [], [], []
            for r in range(args.rounds):
                t = now()
                wb = WeightBuffer.create(f"arl_bench{os.getpid()}_{mb}_{r}", n)
                create.append(now() - t)
                wb.close()
                wb.unlink()
                copy.append(memcpy_s(*bases[0]))
                copy4k.append(memcpy_s(*bases[1]))
            print(row(f"{mb}MB create", create, copy, copy4k))
        streamed, reload, copy, copy4k = handoff(n, args.rounds, src, bases)
        print(row(f"{mb}MB streamed", streamed, copy, copy4k))
        print(row(f"{mb}MB reload", reload, copy, copy4k))
        med = statistics.median
        report["cpu"].append({"mb": mb, "streamed_s": med(streamed), "reload_s": med(reload),
                              "memcpy_s": med(copy), "memcpy4k_s": med(copy4k)})
        del src, dst, src4k, bases
    if args.cuda_params is not None:
        c = cuda_handoff(args.cuda_params, args.rounds)
        report["cuda_ipc"] = c
        print(f"CUDA IPC reload, {c['params'] / 1e9:.2f}B bf16 parameters ({c['bytes'] / 1e9:.2f} GB) on "
              f"{c['device']}: {c['reload_ms']:.1f} ms ({c['reload_gb_s']:.0f} GB/s; "
              f"{c['reload_ms_min_max'][0]:.1f}-{c['reload_ms_min_max'][1]:.1f} ms) vs a device-to-device "
              f"copy {c['d2d_ms']:.1f} ms ({c['d2d_gb_s']:.0f} GB/s): {c['reload_over_d2d']:.2f}x; "
              f"publish {c['publish_ms']:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
