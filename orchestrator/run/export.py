"""`python -m orchestrator.export RUN_DIR [--step K] [--adapter] OUT`: write a checkpoint's model.

A full fine-tune's checkpoint holds `trainer/hf/` (config.json, generation_config.json, tokenizer
files, the safetensors weights; what `AutoModelForCausalLM.from_pretrained` and vLLM load as they
are): this copies the one of the newest valid checkpoint, or of step K, to OUT. A LoRA run's
checkpoint (`actor.lora`) holds `trainer/adapter/`, a peft adapter directory, instead: OUT gets the
merged HF model (the run's base with the adapters merged, built by the `merge_lora` the entry
module passes: `orchestrator.backends.lora.export_merged`, which checks the base against the hash
the checkpoint holds), or with `--adapter` the adapter directory itself (what
`peft.PeftModel.from_pretrained(base, OUT)` loads). OUT is written beside it under a temporary name
and renamed into place, so it is whole or absent. The checkpoint is validated against its manifest
first; a run may be training meanwhile (committed checkpoints never change).
Exit codes: 0 written; 2 bad input (no such run dir, no valid checkpoint or none at step K, OUT
exists and is not an empty directory, --adapter for a run without LoRA, a LoRA base that changed),
one line on stderr.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HF = os.path.join("trainer", "hf")
ADAPTER = os.path.join("trainer", "adapter")


class ExportError(ValueError):
    pass


def find_checkpoint(run_dir: str, step=None) -> str:
    return _find(run_dir, step)[0]


def _find(run_dir: str, step=None) -> tuple[str, dict]:
    from orchestrator.run import checkpoint

    if not os.path.isdir(run_dir):
        raise ExportError(f"run dir {run_dir} does not exist")
    found = checkpoint.find_resumable(run_dir, at_most=step)
    if found.path is None or (step is not None and found.state["step"] != step):
        steps = [s for s, _ in checkpoint.committed(run_dir)]
        what = f"at step {step}" if step is not None else "at all"
        raise ExportError(f"{run_dir} has no valid checkpoint {what} (committed steps: "
                          f"{steps or 'none'}{'; damaged: ' + found.skipped[0] if found.skipped else ''})")
    if not any(os.path.isdir(os.path.join(found.path, d)) for d in (HF, ADAPTER)):
        raise ExportError(f"{found.path} has no {HF}/ (written before HF export existed)")
    return found.path, found.state


def export(run_dir: str, out: str, step=None, adapter: bool = False, merge_lora=None) -> str:
    """Write the checkpoint's model to `out` (see the module contract); returns the checkpoint
    directory used. `merge_lora(trainer_dir, config, out)` writes a LoRA checkpoint's merged model."""
    ckpt, state = _find(run_dir, step)
    lora = os.path.isdir(os.path.join(ckpt, ADAPTER))
    if adapter and not lora:
        raise ExportError(f"{ckpt} holds no LoRA adapter (the run trained every weight, without "
                          f"actor.lora): export it without --adapter")
    if lora and not adapter and merge_lora is None:
        raise ExportError(f"{ckpt} holds LoRA adapters: merging them needs the torch backends "
                          f"(python -m orchestrator.export), or pass --adapter")
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ExportError(f"{out} exists and is not an empty directory")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        staged = os.path.join(tmp, "model")
        if lora and not adapter:
            try:
                merge_lora(os.path.join(ckpt, "trainer"), state.get("config") or {}, staged)
            except (ValueError, KeyError, OSError) as exc:
                raise ExportError(f"cannot merge the LoRA adapters of {ckpt}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        else:
            shutil.copytree(os.path.join(ckpt, ADAPTER if adapter else HF), staged)
        if os.path.isdir(out):
            os.rmdir(out)
        os.replace(staged, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ckpt


def main(argv=None, merge_lora=None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.export",
                                description="Write a checkpoint's HF model directory (or a LoRA "
                                            "run's adapter).")
    p.add_argument("run_dir")
    p.add_argument("out")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest valid)")
    p.add_argument("--adapter", action="store_true",
                   help="a LoRA run: write the peft adapter directory instead of the merged model")
    args = p.parse_args(argv)
    try:
        ckpt = export(args.run_dir, args.out, args.step, args.adapter, merge_lora)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {ckpt} -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
