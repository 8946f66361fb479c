"""Run directory lifecycle: fresh start or resume (`run.resume=auto|never|must`).

Layout: config.yaml (resolved), metrics.jsonl, checkpoints/step_NNNNNNNN/{supervisor.json,trainer/},
checkpoints/latest (name of the newest complete checkpoint), batches/step_NNNNNNNN.rec, logs/.
On resume from step k, metrics lines of steps after k are dropped (the resumed run logs them again,
so steps stay contiguous with no duplicate) and half-written checkpoints are discarded.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Optional

from orchestrator.checkpoint import atomic_write
from orchestrator.config import Config


class RunDirError(ValueError):
    pass


@dataclass
class RunPlan:
    run_dir: str
    start_step: int
    checkpoint: Optional[str]
    cursor_state: Optional[dict]
    complete: bool = False      # the checkpoint already reaches run.total_steps


def latest_checkpoint(run_dir: str) -> Optional[str]:
    path = os.path.join(run_dir, "checkpoints", "latest")
    try:
        name = open(path).read().strip()
    except FileNotFoundError:
        return None
    ckpt = os.path.join(run_dir, "checkpoints", name)
    if not os.path.isfile(os.path.join(ckpt, "supervisor.json")):
        raise RunDirError(f"checkpoint '{ckpt}' named by checkpoints/latest is incomplete")
    return ckpt


def _truncate_metrics(path: str, step: int) -> None:
    if not os.path.exists(path):
        return
    keep = []
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue          # a line cut by a kill
            if rec.get("kind") in ("step", "eval") and rec.get("step", 0) > step:
                continue
            keep.append(json.dumps(rec) + "\n")
    atomic_write(path, "".join(keep).encode())


def prepare_run_dir(cfg: Config) -> RunPlan:
    run_dir = os.path.abspath(cfg.run.dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"run.dir '{run_dir}' cannot be created: {exc.strerror}") from None
    ckpt = latest_checkpoint(run_dir) if cfg.run.resume != "never" else None
    if cfg.run.resume == "must" and ckpt is None:
        raise RunDirError(f"run.resume=must but run.dir '{run_dir}' has no checkpoint")
    ckdir = os.path.join(run_dir, "checkpoints")
    if ckpt is None:
        for sub in ("checkpoints", "batches"):
            shutil.rmtree(os.path.join(run_dir, sub), ignore_errors=True)
        if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
            os.remove(os.path.join(run_dir, "metrics.jsonl"))
        start, cursor = 0, None
    else:
        state = json.load(open(os.path.join(ckpt, "supervisor.json")))
        start = int(state["step"])
        if start >= cfg.run.total_steps:     # nothing left to do: resuming a finished run is a no-op
            return RunPlan(run_dir, start, ckpt, None, complete=True)
        cursor = {"cursor": int(state["cursor"]), "redo": [int(i) for i in state["redo"]]}
        _truncate_metrics(os.path.join(run_dir, "metrics.jsonl"), start)
        if os.path.isdir(ckdir):
            for name in os.listdir(ckdir):
                if name.endswith(".partial"):
                    shutil.rmtree(os.path.join(ckdir, name), ignore_errors=True)
    for sub in ("checkpoints", "batches", "logs"):
        os.makedirs(os.path.join(run_dir, sub), exist_ok=True)
    atomic_write(os.path.join(run_dir, "config.yaml"), cfg.to_yaml().encode())
    return RunPlan(run_dir, start, ckpt, cursor)
