"""The event thread's per-step work on a large batch against one memcpy of the batch's bytes,
measured in the same run.

    python scripts/bench_event_thread.py [--groups 256] [--group-size 16] [--seq-len 256] [--rounds 5]

Per step the event thread builds the batch from finished groups (`TrainSink.take_batch`), encodes
it (`shm.codec.encode`), persists it (`durable.write_record`, zstd at `--level`, not fsynced: that
happens once per checkpoint) and computes the step line's age statistics (`stamp.sequence_stamps`,
`stamp.token_ages`). Each round times every stage on fresh groups and copies the encoded record once
(the baseline); the table prints medians, the min-max spread and each stage's ratio to the memcpy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from orchestrator.run.durable import write_record  # noqa: E402
from orchestrator.algo.stamp import age_summary, sequence_stamps, token_ages  # noqa: E402
from orchestrator.loop.train_sink import TrainSink  # noqa: E402
from shm.codec import Sequences, encode  # noqa: E402


def _group(rng, ident: int, n: int, length: int) -> Sequences:
    total = n * length
    return Sequences(kind=0, ident=ident, version=-1,
                     offsets=np.arange(0, total + 1, length, dtype=np.int64),
                     prompt_lens=np.full(n, length // 4, np.int32), prompt_ids=np.full(n, ident),
                     tokens=rng.integers(0, 32000, total).astype(np.int32),
                     logprobs=rng.standard_normal(total).astype(np.float32),
                     versions=rng.integers(5, 8, total).astype(np.int32),
                     loss_mask=(rng.random(total) > 0.25).astype(np.uint8),
                     rewards=rng.random(n).astype(np.float32), advantages=np.zeros(n, np.float32),
                     scalars=np.zeros(0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=256)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--level", type=int, default=3, help="zstd level of the persisted batch (0: off)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {k: [] for k in ("take_batch", "encode", "write", "ages", "memcpy")}
    with tempfile.TemporaryDirectory(prefix="arl-bench-et-") as tmp:
        for r in range(args.rounds + 1):
            sink = TrainSink(args.groups, False)
            for i in range(args.groups):
                sink.add(_group(rng, i, args.group_size, args.seq_len))
            t0 = time.perf_counter()
            batch, info = sink.take_batch(1, 8)
            t1 = time.perf_counter()
            record = encode(batch)
            t2 = time.perf_counter()
            write_record(os.path.join(tmp, f"step_{r}.rec"), record, durable=False,
                         compress=args.level)
            t3 = time.perf_counter()
            c = info.consumed
            heads, _, live = sequence_stamps(c.offsets, c.versions, c.loss_mask)
            age_summary(info.version - heads[live])
            age_summary(token_ages(info.version, c.versions, c.loss_mask))
            t4 = time.perf_counter()
            dst = bytearray(len(record))          # allocated outside the timed copy, like the ring
            t5 = time.perf_counter()
            dst[:] = record
            t6 = time.perf_counter()
            if r:                                  # round 0 warms the allocator
                for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t6 - t5)):
                    times[k].append(v)
    tokens = args.groups * args.group_size * args.seq_len
    copy = statistics.median(times["memcpy"])
    print(f"batch: {args.groups} groups x {args.group_size} x {args.seq_len} tokens = {tokens} tokens, "
          f"record {len(record) / 2**20:.1f} MiB, zstd level {args.level}, {args.rounds} rounds")
    print(f"{'stage':>11s} {'median s':>9s} {'(min-max)':>17s} {'/ memcpy':>9s}")
    total = 0.0
    for k, xs in times.items():
        m = statistics.median(xs)
        total += m if k != "memcpy" else 0.0
        print(f"{k:>11s} {m:9.4f} {f'({min(xs):.4f}-{max(xs):.4f})':>17s} {m / copy:9.1f}")
    print(f"{'per step':>11s} {total:9.4f} {'':>17s} {total / copy:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
