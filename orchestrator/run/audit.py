"""Audit of a run directory: the promises a finished (or running) run must keep, read from disk.

    python -m orchestrator.audit RUN_DIR [--in-progress]     # JSON on stdout; exit 0 iff ok

`audit(run_dir, final=True)` checks: metrics.jsonl parses (a kill may cut only its last line); step
lines are 1..k, each once (k = run.total_steps when final); the first step after each resume
admitted at most (S+1)*B; batches/step_K.rec of steps 1..k decode (checksummed record files, or bare
codec records of older runs) with ident K, version K-1 and B*group_size samples (plus the step line's
`branches`: an agent episode's extra branches, each group then counted as one run of its prompt); no prompt index is
trained twice, and when final every prompt of the stream 0..T*B-1 (mod task.num_train_prompts) is
trained exactly once, group_size samples each. The prompt check assumes every batch holds all its
groups (rollout.filter_zero_std=false): with the filter on, dropped groups count as never trained.
With rollout.dynamic_sampling, the groups it filtered (each step line's `filtered_prompts`) count as
consumed, the stream is 0..T*B+F-1 (F filtered groups), and the resume bound is on admissions less
the filtered groups whose slots they took (`filtered`). The prompts of quarantined rows
(`task.env_hang_limit`; each step line's `quarantined_prompts`) count as consumed the same way.
With `run.keep_batches`, batch files may be gone (pruned): they are counted (`batches_pruned`), the
kept ones are checked, and "every prompt trained" cannot be (only "none twice"). Which ones may be
gone is read from `checkpoints/retention.jsonl` (one line per checkpoint commit: its step c and the
run.keep_batches N of the launch that committed it; steps <= c - N may be pruned from then on), so
each stretch is judged by the retention in force when it was written, whatever the newest config
says; run directories from before that file: steps more than config.yaml's run.keep_batches before k.
Returns the check fields, `failures` (one string each) and `ok`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

import yaml


def read_metrics(run_dir) -> tuple[list[dict], list[int], int]:
    """(records, indices of unparseable lines, number of lines) of metrics.jsonl."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return [], [], 0
    recs, bad = [], []
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError
            recs.append(rec)
        except ValueError:
            bad.append(i)
    return recs, bad, len(lines)


def read_batch(path):
    """A persisted batch: a checksummed record file, or (older runs) a bare codec record."""
    from shm.codec import decode
    try:
        from orchestrator.run.durable import RecordError, read_record
    except ImportError:               # a runtime from before record files
        RecordError = read_record = None
    if read_record is not None:
        try:
            return decode(read_record(path))
        except RecordError as exc:
            if "bad magic" not in str(exc):
                raise
    with open(path, "rb") as f:
        return decode(f.read())


def _prunable_upto(run_dir, keep, k: int) -> int:
    """Batch files of steps <= this may have been deleted by retention (module docstring)."""
    try:
        with open(os.path.join(run_dir, "checkpoints", "retention.jsonl"), "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:        # a run directory from before the retention history
        return k - int(keep) if keep is not None else 0
    upto = 0
    for line in lines:
        try:
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("keep_batches") is not None:
                upto = max(upto, int(rec["step"]) - int(rec["keep_batches"]))
        except (ValueError, TypeError, KeyError):      # a line cut by a crash
            continue
    return upto


def audit(run_dir, final: bool = True) -> dict:
    """Check a run directory. final=False: a run in progress (steps 1..k for some k, no prompt
    trained twice so far). Returns the check fields plus `failures` (strings) and `ok`."""
    failures = []
    cfg = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    target = int(cfg["run"]["total_steps"])
    r = cfg["rollout"]
    B, S, g = int(r["consumer_batch_size"]), int(r["max_head_offpolicyness"]), int(r.get("group_size", 1))
    num_train = int(cfg.get("task", {}).get("num_train_prompts", 100000))
    bound = (S + 1) * B
    recs, bad, nlines = read_metrics(run_dir)
    if [i for i in bad if i != nlines - 1]:          # a kill may cut the last line, nothing else
        failures.append(f"metrics.jsonl has unparseable lines {[i + 1 for i in bad][:5]}")
    steps = [x for x in recs if x.get("kind") == "step"]
    numbers = [x.get("step") for x in steps]
    contiguous = numbers == list(range(1, len(numbers) + 1))
    if not contiguous:
        dup = sorted(k for k, c in Counter(numbers).items() if c > 1)
        gaps = sorted(set(range(1, max([n for n in numbers if isinstance(n, int)], default=0) + 1))
                      - set(numbers))
        failures.append(f"step lines not 1..k each once: duplicates {dup[:10]}, missing {gaps[:10]}, "
                        f"order head {numbers[:5]}")
    final_ok = bool(numbers) and numbers[-1] == target
    if final and not final_ok:
        failures.append(f"last step line is {numbers[-1] if numbers else None}, target {target}")
    resumed = [x for x in steps if x.get("resumed")]
    over = [(x["step"], x.get("admitted")) for x in resumed        # filtered groups freed their slots
            if not (x.get("admitted", 0) - x.get("filtered", 0) <= bound)]
    if over:
        failures.append(f"first step after resume admitted more than (S+1)*B={bound}: {over}")

    # prompts: steps 1..k (k = the last contiguous step line)
    k = target if final else (len(numbers) if contiguous else 0)
    # dynamic sampling: groups filtered instead of trained consume their prompts too (listed by the
    # step line of the batch they rode with), so the stream is that much longer
    filtered = [int(p) for x in steps[:k] for p in x.get("filtered_prompts") or ()]
    # so do the prompts of quarantined rows (task.env_hang_limit), skipped instead of generated
    filtered += [int(p) for x in steps[:k] for p in x.get("quarantined_prompts") or ()]
    expected = Counter()
    for index in range(target * B + len(filtered)):
        expected[index % num_train] += g
    prunable = _prunable_upto(run_dir, cfg["run"].get("keep_batches"), k)
    by_step = {x.get("step"): x for x in steps}
    seen, batch_errors, pruned = Counter(), [], 0
    for step in range(1, k + 1):
        path = os.path.join(run_dir, "batches", f"step_{step:08d}.rec")
        try:
            b = read_batch(path)
        except FileNotFoundError:
            if step <= prunable:
                pruned += 1
            else:
                batch_errors.append(f"step {step}: no batch file")
            continue
        except Exception as exc:                # RecordError, CodecError: a damaged batch
            batch_errors.append(f"step {step}: {type(exc).__name__}: {exc}")
            continue
        n = len(b.offsets) - 1
        extra = int(by_step.get(step, {}).get("branches") or 0)     # agent branches beyond g each
        if b.ident != step or b.version != step - 1 or n != B * g + extra:
            batch_errors.append(f"step {step}: ident {b.ident}, version {b.version}, {n} samples "
                                f"(expected {step}, {step - 1}, {B * g + extra})")
        ids = [int(i) for i in b.prompt_ids.tolist()]
        if extra:           # a group (its g episodes and their branches) is one run of its prompt
            ids = [p for j, p in enumerate(ids) if j == 0 or ids[j - 1] != p for _ in range(g)]
        seen.update(ids)
    for p in filtered:
        seen[p] += g
    if batch_errors:
        failures.append(f"batch files: {batch_errors[:5]}" + (f" (+{len(batch_errors) - 5})"
                                                              if len(batch_errors) > 5 else ""))
    twice = sorted(i for i, c in seen.items() if c > expected.get(i, 0))
    missing = sorted(i for i, c in expected.items() if seen.get(i, 0) < c) if final and not pruned else []
    prompts_ok = not batch_errors and not twice and not missing
    if twice:
        failures.append(f"prompts trained more than once (or out of range): {twice[:10]}"
                        + (f" (+{len(twice) - 10})" if len(twice) > 10 else ""))
    if missing:
        failures.append(f"prompts never trained: {missing[:10]}"
                        + (f" (+{len(missing) - 10})" if len(missing) > 10 else ""))
    return {
        "steps_contiguous": contiguous,
        "final_step_is_target": final_ok,
        "last_step": numbers[-1] if numbers else 0,
        "bound_kept_on_resume": not over,
        "resumed_steps": [x["step"] for x in resumed],
        "resumed_admitted": [x.get("admitted") for x in resumed],
        "prompts_exactly_once": prompts_ok,
        "batches_pruned": pruned,
        "failures": failures,
        "ok": not failures,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.audit", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--in-progress", action="store_true", help="the run is not finished yet")
    args = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(args.run_dir, "config.yaml")):
        print(f"error: {args.run_dir} is not a run directory (no config.yaml)", file=sys.stderr)
        return 2
    result = audit(args.run_dir, final=not args.in_progress)
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
