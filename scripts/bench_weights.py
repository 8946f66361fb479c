"""Weight buffer creation against one memcpy of the same bytes, measured in the same run.

    python scripts/bench_weights.py [--sizes-mb 100,1024,4096] [--rounds 3]

Creating a `shm.weights.WeightBuffer` of N bytes allocates two N-byte slots in /dev/shm up front
(so a full /dev/shm fails at creation, not with SIGBUS mid-run). It is done by one posix_fallocate
call; before, every page was touched from Python (18.5 s for 4 GB). Each round creates and unlinks
a buffer and times a copy of N bytes between two preallocated numpy arrays (the baseline); the
table prints medians, the spread (min-max) over rounds, and the ratio create / memcpy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from shm.weights import WeightBuffer  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="100,1024,4096")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"{'size':>8s} {'create s':>9s} {'(min-max)':>15s} {'memcpy s':>9s} {'(min-max)':>15s} "
          f"{'create/memcpy':>14s}")
    for mb in (int(x) for x in args.sizes_mb.split(",")):
        n = mb << 20
        src, dst = np.ones(n, np.uint8), np.zeros(n, np.uint8)
        create, copy = [], []
        for r in range(args.rounds):
            t = time.perf_counter()
            wb = WeightBuffer.create(f"arl_bench{os.getpid()}_{mb}_{r}", n)
            create.append(time.perf_counter() - t)
            wb.close()
            wb.unlink()
            t = time.perf_counter()
            np.copyto(dst, src)
            copy.append(time.perf_counter() - t)
        del src, dst
        c, m = statistics.median(create), statistics.median(copy)
        print(f"{mb:6d}MB {c:9.3f} {f'({min(create):.3f}-{max(create):.3f})':>15s} {m:9.3f} "
              f"{f'({min(copy):.3f}-{max(copy):.3f})':>15s} {c / m:14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
