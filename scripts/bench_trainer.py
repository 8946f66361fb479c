"""Trainer ranks: tokens/s per rank, scaling N ranks vs 1, micro-batch and packing overhead, and
the weight publish against one memcpy of the same bytes, all measured in the same run.

    python scripts/bench_trainer.py [--ranks 1,2] [--rounds 5] [--steps 4] [--device cpu|cuda]

Each configuration spawns its ranks as the supervisor does (spawn, a gloo or NCCL process group from
MASTER_ADDR/PORT, FSDP2 for N > 1, `orchestrator.backends.torch_trainer.TorchTrainer`) and trains
the same synthetic batches (lognormal sequence lengths, half prompt, half answer). Per round it
times `--steps` train steps after a warm-up step, and one publish: every rank writing its shards into
a real `shm.weights.WeightBuffer` (`trainer_worker.publish_together`), against a numpy copy of the same
bytes on rank 0 (the baseline). The table prints medians with the spread (min-max) over rounds:
tokens/s, tokens/s per rank, the ratio to 1 rank with the same split, the ratio to the same ranks
with one pass per rank (micro-batch overhead) and to padded passes (packing), publish / memcpy.
On a GPU it also prints model FLOPs utilisation (6 x parameters x tokens / time / peak dense bf16,
per rank); the model computes in bfloat16 there. `--kl` adds a one-pass case with a KL term to a
frozen reference (`actor.kl_ctl`, #24): its "vs 1 pass" column is the reference forward's cost
(tokens/s with it over tokens/s without). `--lora RANK` adds a one-pass case training LoRA adapters
of that rank on every linear layer (#25): "vs 1 pass" is its tokens/s over full fine-tuning's, and
the "peak MB" column (every case) is rank 0's peak memory: its RSS on CPU (the process's high-water
mark: model, optimizer state, activations), `torch.cuda.max_memory_allocated` on a GPU. The LoRA case
also times, every round, the adapter-only publish (`inference.vllm.lora`: A and B alone, gathered and
written by rank 0 into a WeightBuffer of their size, `TorchTrainer.write_adapters`) beside the merged
one (base + B x A into the full layout), and prints both publishes' bytes and ms (median, min-max
over rounds) and the merged / adapter-only ratios.
`--json OUT` writes every row to OUT.
CPU ranks each get `--threads` intra-op threads, so N ranks use N x threads cores.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}   # dense bf16 FLOP/s


def _batch(seed: int, n: int, mean_len: int, vocab: int):
    from shm.codec import Sequences
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(np.log(mean_len), 0.5, n).astype(np.int64), 4, 4 * mean_len)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    total = int(offsets[-1])
    mask = np.zeros(total, np.uint8)
    for i in range(n):
        mask[offsets[i] + lens[i] // 2:offsets[i + 1]] = 1
    return Sequences(kind=1, ident=1, version=0, offsets=offsets,
                     prompt_lens=(lens // 2).astype(np.int32), prompt_ids=np.arange(n),
                     tokens=rng.integers(3, vocab, total).astype(np.int32),
                     logprobs=np.full(total, -3.0, np.float32), versions=np.zeros(total, np.int32),
                     loss_mask=mask, rewards=np.zeros(n, np.float32),
                     advantages=rng.standard_normal(n).astype(np.float32), scalars=np.zeros(0))


def _rank(rank, world, port, args, case, wname, aname, out):
    import torch
    from orchestrator.backends.sharding import RankGroup
    from orchestrator.runtime.rank_failures import rendezvous_env
    from orchestrator.runtime.trainer_worker import publish_together
    from orchestrator.backends.torch_trainer import TorchTrainer
    from orchestrator.config import ActorConfig, ModelConfig, TaskConfig
    from shm.weights import WeightBuffer

    os.environ.update(rendezvous_env(rank, world, port))
    if args.device == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    actor = ActorConfig(backend="torch", threads=args.threads, num_ranks=world,
                        sharding="fsdp" if world > 1 else "none", ppo_epochs=1,
                        micro_batch_tokens=case["budget"], pack_sequences=case["packed"],
                        param_dtype="bfloat16" if args.device == "cuda" else None,
                        kl_ctl=0.04 if case.get("kl") else 0.0,
                        lora={"rank": case["lora"], "target_modules": "all-linear"} if case.get("lora") else None)
    group = RankGroup.from_env(actor, device) if world > 1 else None
    model = ModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                        max_seq_len=8 * args.mean_len,
                        dtype="bfloat16" if args.device == "cuda" else "float32")
    tr = TorchTrainer(model, actor, TaskConfig(name="copy2"), seed=0, device=device, group=group)
    vocab = len(tr.tokens.tokenizer)
    batches = [_batch(s, args.seqs, args.mean_len, vocab) for s in range(args.steps + 1)]
    tokens = sum(b.T for b in batches[1:])
    wbuf = WeightBuffer.attach(wname)
    nbytes = tr.weight_nbytes()
    abuf = WeightBuffer.attach(aname) if aname else None       # LoRA: the adapter-only publish
    anbytes = tr.adapter_layout.nbytes if abuf is not None else 0
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    rounds = []
    for r in range(args.rounds + 1):
        tr.train_step(batches[0])                        # warm-up (first round: allocation)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if group:
            group.barrier()
        t0 = time.perf_counter()
        for b in batches[1:]:
            tr.train_step(b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        if group:
            group.barrier()
        t0 = time.perf_counter()
        publish_together(wbuf, tr.write_weights, group, nbytes, r)
        publish_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copy_s = time.perf_counter() - t0
        adapter_s = float("nan")
        if abuf is not None:
            if group:
                group.barrier()
            t0 = time.perf_counter()
            publish_together(abuf, tr.write_adapters, group, anbytes, r)
            adapter_s = time.perf_counter() - t0
        if r:                                            # round 0 is a warm-up
            rounds.append((tokens / train_s, publish_s, copy_s, adapter_s, anbytes, nbytes))
    if rank == 0:
        params = sum(s.numel for s in tr.layout.slots)     # the full model, sharded or not
        if device.type == "cuda":
            peak_mb = torch.cuda.max_memory_allocated() / 2**20
        else:
            import resource
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024    # KiB on Linux
        np.save(out, np.array([[*x[:3], params, peak_mb, *x[3:]] for x in rounds]))
    wbuf.close()
    if abuf is not None:
        abuf.close()
    tr.close()


def run_case(args, world: int, case: dict, tmp: str):
    import torch.multiprocessing as mp
    from orchestrator.runtime.rank_failures import free_port
    from orchestrator.config import ModelConfig
    from orchestrator.backends.model import build_model, flat_layout
    from orchestrator.data.tokens import build_tokenizer
    from shm.weights import WeightBuffer

    mc = ModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                     max_seq_len=8 * args.mean_len)
    model = build_model(mc, len(build_tokenizer()), 0)
    nbytes = flat_layout(model).nbytes
    wname = f"arl_benchtr{os.getpid()}_{world}"
    bufs = [WeightBuffer.create(wname, nbytes)]
    aname = None
    if case.get("lora"):                   # the adapters' own buffer: the adapter-only publish
        from orchestrator.backends import lora
        from orchestrator.config import LoraConfig
        peft_model = lora.wrap(model, LoraConfig(rank=case["lora"], target_modules="all-linear"), 0)
        aname = f"arl_benchtra{os.getpid()}_{world}"
        bufs.append(WeightBuffer.create(aname, lora.adapter_layout(peft_model).nbytes))
    out = os.path.join(tmp, f"r{world}.npy")
    try:
        mp.start_processes(_rank, args=(world, free_port(), args, case, wname, aname, out),
                           nprocs=world, start_method="spawn", join=True)
    finally:
        for b in bufs:
            b.close()
            b.unlink()
    return np.load(out)


def _med(xs) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def _publish_row(world: int, label: str, res) -> dict:
    """A LoRA case's publishes: merged (column 1) and adapter-only (column 5), bytes and ms
    (median, min, max over rounds), and merged / adapter-only per round (median, min, max)."""
    return {"ranks": world, "split": label,
            "merged_bytes": int(res[0, 7]), "adapter_bytes": int(res[0, 6]),
            "merged_ms": _med(list(res[:, 1] * 1e3)), "adapter_ms": _med(list(res[:, 5] * 1e3)),
            "bytes_ratio": float(res[0, 7] / res[0, 6]),
            "time_ratio": _med(list(res[:, 1] / res[:, 5]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed train steps per round")
    ap.add_argument("--seqs", type=int, default=64, help="sequences per batch")
    ap.add_argument("--mean-len", type=int, default=48, help="mean sequence length (lognormal)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--budget", type=int, default=1024, help="micro_batch_tokens of the split cases")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per CPU rank")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", default=None, metavar="OUT", help="write every row to OUT")
    ap.add_argument("--kl", action="store_true", help="add a case with a KL term to a frozen reference")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK",
                    help="add a case training LoRA adapters of this rank (0: none)")
    args = ap.parse_args(argv)
    cases = {"one pass": {"budget": None, "packed": False},
             f"micro {args.budget}": {"budget": args.budget, "packed": False},
             f"packed {args.budget}": {"budget": args.budget, "packed": True}}
    if args.kl:
        cases["kl ref"] = {"budget": None, "packed": False, "kl": True}
    if args.lora:
        cases[f"lora r{args.lora}"] = {"budget": None, "packed": False, "lora": args.lora}
    peak = None
    if args.device == "cuda":
        import torch
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    print(f"model hidden {args.hidden} x {args.layers} layers; {args.seqs} sequences of ~{args.mean_len} "
          f"tokens per batch; {args.rounds} rounds of {args.steps} steps; device {args.device}")
    print(f"{'ranks':>5s} {'split':>12s} {'tokens/s':>9s} {'(min-max)':>17s} {'per rank':>9s} "
          f"{'vs 1 rank':>9s} {'vs 1 pass':>9s} {'vs padded':>9s} {'publish/memcpy':>15s} {'peak MB':>8s}"
          + (f" {'MFU':>6s}" if peak else ""))
    base: dict = {}
    rows = []
    publishes = []
    with tempfile.TemporaryDirectory(prefix="arl-bench-trainer-") as tmp:
        for world in (int(x) for x in args.ranks.split(",")):
            for label, case in cases.items():
                res = run_case(args, world, case, tmp)
                tps, lo, hi = _med(res[:, 0])
                pub = statistics.median(res[:, 1] / res[:, 2])
                base.setdefault(label, tps) if world == 1 else None
                one = f"{tps / base[label]:9.2f}" if label in base else f"{'-':>9s}"
                first = base.get((world, "one pass"))
                if label == "one pass":
                    base[(world, label)] = tps
                    first = tps
                padded = base.get((world, f"micro {args.budget}"))
                if label.startswith("micro"):
                    base[(world, label)] = tps
                vs_pad = f"{tps / padded:9.2f}" if label.startswith("packed") and padded else f"{'-':>9s}"
                mfu = f" {6 * res[0, 3] * tps / world / peak:6.1%}" if peak else ""
                rows.append({"ranks": world, "split": label, "tokens_per_s": tps, "min": lo, "max": hi,
                             "params": int(res[0, 3]), "publish_over_memcpy": pub,
                             "peak_mb": float(res[:, 4].max()),
                             "mfu": 6 * res[0, 3] * tps / world / peak if peak else None})
                print(f"{world:5d} {label:>12s} {tps:9.0f} {f'({lo:.0f}-{hi:.0f})':>17s} "
                      f"{tps / world:9.0f} {one} {tps / first:9.2f} {vs_pad} {pub:15.2f} "
                      f"{res[:, 4].max():8.0f}{mfu}")
                if case.get("lora"):
                    publishes.append(_publish_row(world, label, res))
                    rows[-1]["publish"] = publishes[-1]
    for p in publishes:
        print(f"\npublish, {p['ranks']} rank(s), {p['split']}: {'bytes':>10s} {'ms':>8s} {'(min-max)':>17s}")
        for kind in ("merged", "adapter"):
            ms, lo, hi = p[f"{kind}_ms"]
            print(f"  {kind if kind == 'merged' else 'adapter-only':>12s}: {p[f'{kind}_bytes']:10d} "
                  f"{ms:8.3f} {f'({lo:.3f}-{hi:.3f})':>17s}")
        print(f"  {'merged / adapter-only':>21s}: {p['bytes_ratio']:.1f}x the bytes, "
              f"{p['time_ratio'][0]:.1f}x the time (min-max {p['time_ratio'][1]:.1f}-{p['time_ratio'][2]:.1f})")
    if args.json:
        meta = {"device": args.device, "device_name": name if args.device == "cuda" else "cpu",
                "peak_bf16": peak, "dtype": "bfloat16" if args.device == "cuda" else "float32",
                "hidden": args.hidden, "layers": args.layers, "seqs": args.seqs,
                "mean_len": args.mean_len, "steps": args.steps, "rounds": args.rounds}
        Path(args.json).write_text(json.dumps({**meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
