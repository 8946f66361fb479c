"""`python -m orchestrator.export RUN_DIR [--step K] OUT`: write a checkpoint's HF model directory.

Every checkpoint holds `trainer/hf/` (config.json, generation_config.json, tokenizer files, the
safetensors weights; what `AutoModelForCausalLM.from_pretrained` and vLLM load as they are). This
copies the one of the newest valid checkpoint, or of step K, to OUT (written beside it under a
temporary name and renamed into place, so OUT is whole or absent). The checkpoint is validated
against its manifest first; a run may be training meanwhile (committed checkpoints never change).
Exit codes: 0 written; 2 bad input (no such run dir, no valid checkpoint or none at step K, OUT
exists and is not an empty directory), one line on stderr.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HF = os.path.join("trainer", "hf")


class ExportError(ValueError):
    pass


def find_checkpoint(run_dir: str, step=None) -> str:
    from orchestrator.run import checkpoint

    if not os.path.isdir(run_dir):
        raise ExportError(f"run dir {run_dir} does not exist")
    found = checkpoint.find_resumable(run_dir, at_most=step)
    if found.path is None or (step is not None and found.state["step"] != step):
        steps = [s for s, _ in checkpoint.committed(run_dir)]
        what = f"at step {step}" if step is not None else "at all"
        raise ExportError(f"{run_dir} has no valid checkpoint {what} (committed steps: "
                          f"{steps or 'none'}{'; damaged: ' + found.skipped[0] if found.skipped else ''})")
    if not os.path.isdir(os.path.join(found.path, HF)):
        raise ExportError(f"{found.path} has no {HF}/ (written before HF export existed)")
    return found.path


def export(run_dir: str, out: str, step=None) -> str:
    """Copy the checkpoint's `trainer/hf` to `out`; returns the checkpoint directory used."""
    ckpt = find_checkpoint(run_dir, step)
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ExportError(f"{out} exists and is not an empty directory")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        staged = os.path.join(tmp, "hf")
        shutil.copytree(os.path.join(ckpt, HF), staged)
        if os.path.isdir(out):
            os.rmdir(out)
        os.replace(staged, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ckpt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.export",
                                description="Write a checkpoint's HF model directory.")
    p.add_argument("run_dir")
    p.add_argument("out")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest valid)")
    args = p.parse_args(argv)
    try:
        ckpt = export(args.run_dir, args.out, args.step)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {ckpt} -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
