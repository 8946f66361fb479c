"""`python -m orchestrator.inspect RUN_DIR --step N [--worst K [--by advantage|age]] [--jsonl] [--ids]`:
one trained batch, decoded, exactly as the trainer saw it.

Reads `RUN_DIR/batches/step_{N:08d}.rec` (the batch persisted before it shipped: a checksummed record
file, or a bare codec record of an older run) and `RUN_DIR/config.yaml` (the resolved config: it
names the task and model, hence the tokenizer). Text is decoded with the run's tokenizer
(`data.tokens.load_tokens(model.path)`: the built-in character tokenizer, or model.path's), special
tokens kept (the eos a completion stopped on is shown); nothing is re-encoded. A run with the `sim`
task or backend has no tokenizer: its tokens are printed as ids (so is any run with `--ids`).

Per sample: index in the batch, prompt_id, reward, advantage, completion length, the per-token
version stamp over loss-masked tokens (`orchestrator.algo.stamp`: head = oldest, tail = newest, runs
`v x n` in token order; age = batch version - head; "not live" when the versions are -1), which
completion tokens are loss-masked, the behaviour logprob mean over them, prompt and completion.
Human output starts with a header (step, policy version, samples, groups = distinct prompts,
trainable = samples with a loss-masked token, tokens, reward mean). `--worst K`: only the K samples
of lowest advantage (`--by advantage`, the default) or largest head age (`--by age`; samples that
are not live come last), worst first. `--jsonl`: one JSON object per sample, no header; the lists
`loss_mask` and `logprobs` are over the completion tokens (prompt tokens carry mask 0, logprob 0).
Exit codes: 0 printed; 2 bad input (no run dir or no config.yaml, no batch for step N (the steps
that have one are named), a damaged batch file, --worst < 1, a tokenizer that cannot be built), one
line on stderr. torch/transformers are imported only to build a tokenizer, after every check.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

BATCH_NAME = re.compile(r"step_(\d{8})\.rec\Z")


class InspectError(ValueError):
    """Bad input; the message is the one line printed."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):                 # one line, no usage block: the tool's error contract
        raise InspectError(message)


# ---------------------------------------------------------------------------------------- input

def batch_steps(run_dir: str) -> list[int]:
    """Steps that have a batch file, ascending."""
    try:
        names = os.listdir(os.path.join(run_dir, "batches"))
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(BATCH_NAME.match, names) if m)


def _ranges(values: list[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1..3, 7, 9..10'."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}..{values[j]}")
        i = j + 1
    return ", ".join(out)


def load_batch(run_dir: str, step: int):
    """The decoded batch of `step`; InspectError when it is absent or damaged."""
    from orchestrator.run.audit import read_batch
    from orchestrator.run.durable import RecordError
    from shm.codec import CodecError

    path = os.path.join(run_dir, "batches", f"step_{step:08d}.rec")
    if not os.path.isfile(path):
        steps = batch_steps(run_dir)
        have = f"batches exist for steps {_ranges(steps)}" if steps else "it has no batches yet"
        raise InspectError(f"{run_dir} has no batch for step {step} ({have})")
    try:
        batch = read_batch(path)
    except (RecordError, CodecError) as exc:
        raise InspectError(f"{path} is damaged: {exc}") from None
    except OSError as exc:
        raise InspectError(f"cannot read {path}: {exc.strerror}") from None
    if batch.ident != step:
        raise InspectError(f"{path} holds the batch of step {batch.ident}, not {step}")
    return batch


def load_run_config(run_dir: str):
    from orchestrator.config import ConfigError, load_config

    try:
        return load_config(os.path.join(run_dir, "config.yaml"))
    except ConfigError as exc:
        raise InspectError(f"{run_dir}/config.yaml: {exc}") from None


def tokenizer_for(cfg):
    """The run's tokenizer, or None when its tokens are not text (the sim task or backend)."""
    if cfg.task.name == "sim" or cfg.inference.backend == "sim":
        return None
    from orchestrator.data.tokens import load_tokens

    try:
        return load_tokens(cfg.model.path).tokenizer
    except Exception as exc:                 # a moved model dir, a broken tokenizer file: bad input
        why = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        raise InspectError(f"cannot build the tokenizer of model.path={cfg.model.path} ({why}); "
                           f"--ids prints token ids without one") from None


# -------------------------------------------------------------------------------------- samples

def mask_spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """Half-open [start, end) runs of nonzero entries."""
    m = np.concatenate(([0], (np.asarray(mask) != 0).astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(m))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def samples(batch, tokenizer=None) -> list[dict]:
    """One dict per sample of the batch (the --jsonl objects)."""
    from orchestrator.algo.stamp import stamp

    decode = (lambda ids: tokenizer.decode(ids, skip_special_tokens=False)) if tokenizer else None
    out = []
    for i in range(batch.n):
        s, p = batch.seq(i), int(batch.prompt_lens[i])
        toks, mask = batch.tokens[s], batch.loss_mask[s]
        st = stamp(batch.versions[s], mask)
        trained = mask.astype(bool)
        lp = batch.logprobs[s]
        prompt, completion = toks[:p].tolist(), toks[p:].tolist()
        out.append({
            "index": i, "step": int(batch.ident), "prompt_id": int(batch.prompt_ids[i]),
            "reward": float(batch.rewards[i]), "advantage": float(batch.advantages[i]),
            "completion_len": len(completion),
            "live": st is not None,
            "head": st.head if st else None, "tail": st.tail if st else None,
            "age": int(batch.version) - st.head if st else None,
            "version_runs": [list(r) for r in st.rle] if st else [],
            "masked_tokens": int(trained.sum()),
            "logprob_mean": float(lp[trained].mean()) if trained.any() else None,
            "prompt_tokens": prompt, "completion_tokens": completion,
            "prompt_text": decode(prompt) if decode else None,
            "completion_text": decode(completion) if decode else None,
            "loss_mask": mask[p:].tolist(), "logprobs": [float(x) for x in lp[p:]],
            "prompt_masked": int(trained[:p].sum()),
        })
    return out


def worst(rows: list[dict], k: int, by: str) -> list[dict]:
    """The k worst samples, worst first: lowest advantage, or largest head age (not live: last)."""
    if by == "age":
        key = lambda r: (-r["age"] if r["live"] else float("inf"), r["index"])
    else:
        key = lambda r: (r["advantage"], r["index"])
    return sorted(rows, key=key)[:k]


# --------------------------------------------------------------------------------------- output

def header(batch, rows: list[dict]) -> str:
    n_masked = int(np.count_nonzero(batch.loss_mask))
    reward = float(batch.rewards.mean()) if batch.n else 0.0
    return (f"step {batch.ident}  policy version {batch.version}  samples {batch.n}  "
            f"groups {len(set(batch.prompt_ids.tolist()))}  "
            f"trainable {sum(r['masked_tokens'] > 0 for r in rows)}  "
            f"tokens {batch.T} ({n_masked} loss-masked)  reward mean {reward:.4f}")


def _versions(r: dict) -> str:
    if not r["live"]:
        return "not live (versions -1: replayed or external; no age)"
    runs = " | ".join(f"v{v} x {n}" for v, n in r["version_runs"])
    return f"head {r['head']}, tail {r['tail']}, spans {runs}  (head age {r['age']})"


def _mask(r: dict) -> str:
    spans = ", ".join(f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in mask_spans(r["loss_mask"]))
    text = (f"{sum(r['loss_mask'])} of {r['completion_len']} completion tokens"
            + (f" (positions {spans})" if spans else ""))
    if r["prompt_masked"]:
        text += f"; {r['prompt_masked']} prompt tokens too"
    return text


def _block(label: str, text, ids: list[int]) -> list[str]:
    if text is None:
        return [f"  {label}: {len(ids)} ids [{' '.join(map(str, ids))}]"]
    return [f"  {label}:"] + [f"    | {line}" for line in text.split("\n")]


def render(r: dict) -> str:
    lp = "none" if r["logprob_mean"] is None else f"{r['logprob_mean']:.4f}"
    lines = [f"[{r['index']}] prompt_id {r['prompt_id']}  reward {r['reward']:.4f}  "
             f"advantage {r['advantage']:+.4f}  completion {r['completion_len']} tokens",
             f"  versions: {_versions(r)}",
             f"  loss mask: {_mask(r)}",
             f"  behaviour logprob mean: {lp}"]
    lines += _block("prompt", r["prompt_text"], r["prompt_tokens"])
    lines += _block("completion", r["completion_text"], r["completion_tokens"])
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ cli

def inspect(argv=None) -> list[str]:
    """The lines to print; InspectError on bad input."""
    ap = _Parser(prog="python -m orchestrator.inspect", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--step", type=int, required=True, help="the trainer step whose batch to show")
    ap.add_argument("--worst", type=int, default=None, metavar="K", help="only the K worst samples")
    ap.add_argument("--by", choices=("advantage", "age"), default="advantage",
                    help="worst by lowest advantage (default) or largest head age")
    ap.add_argument("--jsonl", action="store_true", help="one JSON object per sample, no header")
    ap.add_argument("--ids", action="store_true", help="token ids instead of decoded text")
    args = ap.parse_args(argv)
    if args.worst is not None and args.worst < 1:
        raise InspectError(f"--worst must be at least 1, got {args.worst}")
    if not os.path.isdir(args.run_dir):
        raise InspectError(f"run dir {args.run_dir} does not exist")
    if not os.path.isfile(os.path.join(args.run_dir, "config.yaml")):
        raise InspectError(f"{args.run_dir} is not a run directory (no config.yaml)")
    batch = load_batch(args.run_dir, args.step)
    cfg = load_run_config(args.run_dir)
    rows = samples(batch, None if args.ids else tokenizer_for(cfg))
    shown = rows if args.worst is None else worst(rows, args.worst, args.by)
    if args.jsonl:
        return [json.dumps(r) for r in shown]
    title = header(batch, rows)
    if args.worst is not None:
        title += f"\nshowing the {len(shown)} worst by {args.by}"
    return [title] + ["\n" + render(r) for r in shown]


def main(argv=None) -> int:
    try:
        lines = inspect(argv)
    except InspectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:                  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
