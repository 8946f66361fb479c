"""Run directory lifecycle: one writer, fresh start or resume (`run.resume=auto|never|must`).

Layout: config.yaml (resolved), metrics.jsonl, run.lock, checkpoints/step_NNNNNNNN/{supervisor.json,
rollouts.rec,trainer/,MANIFEST.json}, checkpoints/latest, checkpoints/retention.jsonl,
batches/step_NNNNNNNN.rec, logs/ (and report/, tensorboard/, wandb/ when those tools write them).

`prepare_run_dir(cfg, data)` checks the directory before anything starts and raises `RunDirError` (exit 2,
one line naming the path or field) when:
- it is not usable: empty (config refuses that first), a file where a directory belongs or the
  reverse, not writable;
- a fresh start (`run.resume=never`, or `auto` with no committed checkpoint) would begin in a directory that
  holds anything this project does not create (`foreign_entries`: a few of them are named; nothing
  is created in it, not even run.lock);
- `run.resume=never` finds a run there (a checkpoint, valid or damaged, step lines in metrics.jsonl
  or batch files; the newest checkpoint is named) and `run.overwrite` is false;
- another live process holds it (an exclusive `flock` on run.lock, kept by the returned plan's
  `lock` for the life of the launch process; the holder's pid is named);
- no checkpoint is valid but some exist (damaged: they are never deleted silently), or
  `run.resume=must` finds none;
- the checkpoint cannot serve this config (`RESUME_FIXED` fields differ: both values named), or
  the training prompts differ from the ones it was trained on (`check_data`);
- `run.resume_step` names no valid checkpoint;
- metrics.jsonl lacks step lines that the checkpoint covers.
Every check runs before anything is deleted: a refused launch leaves the directory as it was.
A fresh start deletes only what a run creates (`RUN_OUTPUTS`: checkpoints/, batches/,
metrics.jsonl, report/, tensorboard/, wandb/, logs/wandb_run_id); logs/ is appended to.
On resume from step k it picks the newest valid checkpoint (`checkpoint.find_resumable`; damaged
ones are skipped with a warning in `plan.warnings`), drops a line cut by a kill and metrics lines
of steps after k (the resumed run writes them again: steps stay contiguous, none duplicated),
batches of steps after k, half-written checkpoints and, for a roll-back (`run.resume_step=k` with
steps left to run), the committed checkpoints after k.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Optional

import yaml

from orchestrator.run import checkpoint
from orchestrator.config import Config, trainer_layout
from orchestrator.run.durable import atomic_write

DIRS = ("checkpoints", "batches", "logs")
FILES = ("config.yaml", "metrics.jsonl", "run.lock")
LOCK = "run.lock"
# what runs write at the top of run.dir (besides `NAME.tmp` of an atomic write and `.probe-PID`)
OURS = frozenset((*DIRS, *FILES, "report", "tensorboard", "wandb"))
_TMP = re.compile(r"(config\.yaml|metrics\.jsonl)\.tmp\Z|\.probe-\d+\Z")
_INSIDE = {"checkpoints": re.compile(r"step_\d{8}(\.partial|\.stale)?\Z|latest(\.tmp)?\Z|\.probe-\d+\Z|"
                                     + re.escape(checkpoint.RETENTION) + r"\Z"),
           "batches": re.compile(r"step_\d{8}\.rec(\.tmp)?\Z|\.probe-\d+\Z")}
# a fresh start deletes these, and only these; logs/ is appended to (a new run is a new W&B run)
RUN_OUTPUTS = ("checkpoints", "batches", "metrics.jsonl", "report", "tensorboard", "wandb",
               os.path.join("logs", "wandb_run_id"))
# config fields a checkpoint fixes: changing them on resume breaks the trainer state, the prompt
# stream (exactly-once) or the meaning of the saved rollouts. task.dataset may move: its prompts
# themselves are compared (check_data)
RESUME_FIXED = (
    "model.path", "model.hidden_size", "model.num_layers", "model.num_heads", "model.max_seq_len",
    "model.dtype", "rollout.consumer_batch_size", "rollout.group_size", "inference.backend",
    "actor.backend", "task.name", "task.num_train_prompts", "run.seed",
    "task.prompt_field", "task.system_prompt", "task.apply_chat_template", "task.max_prompt_tokens",
    "task.overlong_prompts",
    "inference.sim.prompt_tokens", "actor.sim.weight_bytes",
)


class RunDirError(ValueError):
    pass


@dataclass
class RunPlan:
    run_dir: str
    start_step: int
    checkpoint: Optional[str]
    cursor_state: Optional[dict]
    complete: bool = False      # the checkpoint already reaches run.total_steps
    lock: Optional["RunLock"] = None
    warnings: list[str] = field(default_factory=list)
    state: Optional[dict] = None


class RunLock:
    """Exclusive flock on run.dir/run.lock; released by the kernel when this process dies."""

    def __init__(self, run_dir: str):
        path = os.path.join(run_dir, LOCK)
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirError(f"run.dir '{run_dir}': cannot open {LOCK}: {exc.strerror}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunDirError(f"run.dir '{run_dir}' is in use by a live run (pid {holder}); "
                                  f"stop it or choose another run.dir") from None
            raise RunDirError(f"run.dir '{run_dir}': cannot lock {LOCK}: {exc.strerror}") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _check_layout(run_dir: str) -> None:
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise RunDirError(f"run.dir '{run_dir}' exists and is not a directory")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"run.dir '{run_dir}' cannot be created: {exc.strerror}") from None
    for name in DIRS:
        p = os.path.join(run_dir, name)
        if os.path.lexists(p) and not os.path.isdir(p):
            raise RunDirError(f"run.dir '{run_dir}': '{name}' must be a directory, found a file")
    for name in FILES:
        p = os.path.join(run_dir, name)
        if os.path.lexists(p) and not os.path.isfile(p):
            raise RunDirError(f"run.dir '{run_dir}': '{name}' must be a regular file")
    for d in (run_dir, *(os.path.join(run_dir, n) for n in DIRS if os.path.isdir(os.path.join(run_dir, n)))):
        probe = os.path.join(d, f".probe-{os.getpid()}")
        try:
            with open(probe, "wb"):
                pass
            os.remove(probe)
        except OSError as exc:
            raise RunDirError(f"run.dir '{d}' is not writable: {exc.strerror}") from None


def _dotted(data: dict, path: str):
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def check_compatible(cfg: Config, saved: Optional[dict], where: str) -> None:
    """Refuse a resume whose config differs from the checkpoint's in a `RESUME_FIXED` field."""
    if not saved:
        return
    now = cfg.model_dump(mode="json")
    then = trainer_layout(saved.get("actor") or {})[1:]
    if then != trainer_layout(now["actor"])[1:]:
        raise RunDirError(f"cannot resume {where}: its trainer state was saved by {then[0]} rank(s) "
                          f"sharded by {then[1]}, the config now asks for {cfg.actor.world_size} "
                          f"sharded by {cfg.actor.strategy} (restore actor.num_ranks / actor.devices "
                          f"/ actor.sharding, or start a new run.dir)")
    for path in RESUME_FIXED:
        old, new = _dotted(saved, path), _dotted(now, path)
        if old is not None and old != new:
            raise RunDirError(f"cannot resume {where}: it was trained with {path}={old!r}, the config "
                              f"now says {path}={new!r} (restore it, or start a new run.dir)")


def check_data(identity: Optional[dict], state: dict, where: str) -> None:
    """Refuse a resume whose training prompts differ from the checkpoint's (`PromptSet.identity`):
    the saved cursor and redo list index a prompt stream that would no longer be the same."""
    saved = state.get("data")
    if saved is None or identity is None or saved == identity:
        return
    raise RunDirError(f"cannot resume {where}: the training prompts changed since it was written "
                      f"({saved.get('prompts')} prompts, digest {str(saved.get('digest'))[:12]} then; "
                      f"{identity['prompts']}, {identity['digest'][:12]} now), so the prompt stream "
                      f"would not stay exactly once: restore task.dataset, or start a new run.dir")


def _saved_config(run_dir: str, state: dict) -> Optional[dict]:
    if isinstance(state.get("config"), dict):
        return state["config"]
    try:          # checkpoints from before configs were saved in them
        with open(os.path.join(run_dir, "config.yaml")) as f:
            data = yaml.safe_load(f)
        return data if isinstance(data, dict) else None
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None


def repair_metrics(path: str, step: int) -> list[str]:
    """Keep metrics lines up to `step`; drop a line cut by a kill. Returns warnings; raises
    RunDirError if step lines 1..step are not all there exactly once."""
    warnings = []
    if not os.path.exists(path):
        raw = b""
    else:
        with open(path, "rb") as f:
            raw = f.read()
    lines = raw.split(b"\n")
    keep, seen, bad = [], [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
            if not isinstance(rec, dict):
                raise ValueError
        except (UnicodeDecodeError, ValueError):
            if i == len(lines) - 1:          # the last line, cut by a kill: drop it
                warnings.append(f"{path}: dropped a partial last line")
            else:
                bad += 1
            continue
        if rec.get("kind") in ("step", "eval") and isinstance(rec.get("step"), int) and rec["step"] > step:
            continue
        if rec.get("kind") == "step":
            seen.append(rec.get("step"))
        keep.append(json.dumps(rec) + "\n")
    if seen != list(range(1, step + 1)):
        missing = sorted(set(range(1, step + 1)) - set(seen))
        dup = sorted({s for s in seen if seen.count(s) > 1})
        what = f"missing step lines {_ranges(missing)}" if missing else f"duplicate step lines {dup}"
        raise RunDirError(f"{path} is damaged: {what} of the {step} steps the checkpoint covers"
                          + (f" ({bad} unreadable lines)" if bad else "")
                          + "; restore it, or move it aside to resume without those lines")
    if bad:
        warnings.append(f"{path}: dropped {bad} unreadable non-step lines")
    atomic_write(path, "".join(keep).encode())
    return warnings


def _ranges(nums: list[int]) -> str:
    if not nums:
        return ""
    out, start, prev = [], nums[0], nums[0]
    for n in nums[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(out[:5]) + (",..." if len(out) > 5 else "")


def _remove_after(directory: str, step: int) -> None:
    """Drop batches of steps after `step` (from the timeline the resume abandons)."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name.startswith("step_") and name[5:13].isdigit() and int(name[5:13]) > step:
            os.remove(os.path.join(directory, name))


def _check_roll_back(run_dir: str, step: int, found: checkpoint.Found) -> None:
    """run.resume_step: the checkpoint of exactly `step` must be valid (checked, nothing deleted)."""
    if found.path is None or int(found.state["step"]) != step:
        why = f" ({found.skipped[0]})" if found.skipped else ""
        raise RunDirError(f"run.resume_step={step}: run.dir '{run_dir}' has no valid checkpoint of "
                          f"step {step}{why}")


def _delete_later(run_dir: str, step: int) -> None:
    """A roll-back that will run: committed checkpoints after `step` go, so that no later resume
    jumps forward again onto the abandoned timeline."""
    for later, path in checkpoint.committed(run_dir):
        if later > step:
            shutil.rmtree(path)


def foreign_entries(run_dir: str) -> list[str]:
    """Entries of `run_dir` (and of its checkpoints/ and batches/) that no run creates."""
    try:
        names = sorted(os.listdir(run_dir))
    except FileNotFoundError:
        return []
    out = [n for n in names if n not in OURS and not _TMP.match(n)]
    for sub, ours in _INSIDE.items():
        d = os.path.join(run_dir, sub)
        if os.path.isdir(d):
            out += [f"{sub}/{n}" for n in sorted(os.listdir(d)) if not ours.match(n)]
    return out


def _run_held(run_dir: str) -> Optional[str]:
    """What shows that `run_dir` holds a run (None: no run): its newest checkpoint (valid or
    damaged, committed or half-written), else its step lines, else its batch files."""
    ckdir, names = os.path.join(run_dir, "checkpoints"), []
    if os.path.isdir(ckdir):
        names = sorted((n for n in os.listdir(ckdir) if n.startswith("step_")), reverse=True)
    committed = [os.path.basename(p) for _, p in checkpoint.committed(run_dir)]
    if committed or names:
        return f"newest checkpoint {(committed or names)[0]}"
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
            lines = sum(1 for line in f if b'"kind": "step"' in line)
    except FileNotFoundError:
        lines = 0
    if lines:
        return f"{lines} step lines in metrics.jsonl, no checkpoint"
    bdir = os.path.join(run_dir, "batches")
    batches = len([n for n in os.listdir(bdir) if n.startswith("step_")]) if os.path.isdir(bdir) else 0
    return f"{batches} batch files, no checkpoint" if batches else None


def _refuse_foreign(cfg: Config, run_dir: str) -> None:
    """A fresh start never begins among files that are not a run's (it would delete or mix with
    them): checked before run.lock is created, so a refused directory is left as it was."""
    fresh = cfg.run.resume == "never" or (cfg.run.resume == "auto" and not checkpoint.committed(run_dir))
    foreign = foreign_entries(run_dir) if fresh else []
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:3]) + (f" and {len(foreign) - 3} more"
                                                           if len(foreign) > 3 else "")
        raise RunDirError(f"run.dir '{run_dir}' is not empty and is not a run directory: it holds "
                          f"{shown}; choose a new or empty run.dir")


def _clear(run_dir: str) -> None:
    """A fresh start: delete what an earlier run created there (`RUN_OUTPUTS`), nothing else."""
    for rel in RUN_OUTPUTS:
        path = os.path.join(run_dir, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def prepare_run_dir(cfg: Config, data: Optional[dict] = None) -> RunPlan:
    """`data`: the loaded prompt set's identity (compared with the checkpoint's on resume)."""
    if not cfg.run.dir.strip():
        raise RunDirError("invalid config field 'run.dir': must not be empty")
    run_dir = os.path.abspath(cfg.run.dir)
    _check_layout(run_dir)
    _refuse_foreign(cfg, run_dir)
    lock = RunLock(run_dir)
    try:
        plan = _plan(cfg, run_dir, data)
    except BaseException:
        lock.release()
        raise
    plan.lock = lock
    return plan


def _plan(cfg: Config, run_dir: str, data: Optional[dict]) -> RunPlan:
    """Every check first, then the deletions a fresh start or a resume needs."""
    ckdir = os.path.join(run_dir, "checkpoints")
    rollback = cfg.run.resume_step if cfg.run.resume != "never" else None
    if cfg.run.resume == "never":
        held = _run_held(run_dir)
        if held and not cfg.run.overwrite:
            raise RunDirError(f"run.dir '{run_dir}' holds a run ({held}) and run.resume=never would "
                              f"delete it: resume it (run.resume=auto), choose a new run.dir, or set "
                              f"run.overwrite=true to start over")
        found = checkpoint.Found(None, None)
    else:
        found = checkpoint.find_resumable(run_dir, at_most=rollback)
    if rollback is not None:
        _check_roll_back(run_dir, rollback, found)
    warnings = [f"skipped damaged checkpoint: {s}" for s in found.skipped]
    if found.path is None and found.skipped:
        raise RunDirError(f"no valid checkpoint in run.dir '{run_dir}': {found.skipped[0]}"
                          + (f" (and {len(found.skipped) - 1} more)" if len(found.skipped) > 1 else "")
                          + "; fix it, or start over with run.resume=never run.overwrite=true")
    if cfg.run.resume == "must" and found.path is None:
        raise RunDirError(f"run.resume=must but run.dir '{run_dir}' has no checkpoint")
    if found.path is None:
        _clear(run_dir)
        plan = RunPlan(run_dir, 0, None, None, warnings=warnings)
    else:
        state = found.state
        start = int(state["step"])
        check_compatible(cfg, _saved_config(run_dir, state), f"from {found.path}")
        check_data(data, state, f"from {found.path}")
        try:
            latest = open(os.path.join(ckdir, "latest")).read().strip()
        except (OSError, UnicodeDecodeError):
            latest = None
        if latest != os.path.basename(found.path):
            warnings.append(f"checkpoints/latest names {latest!r}; resuming from the newest valid "
                            f"checkpoint {os.path.basename(found.path)}")
        if start >= cfg.run.total_steps:     # nothing left to do: resuming a finished run is a no-op
            return RunPlan(run_dir, start, found.path, None, complete=True, warnings=warnings,
                           state=state)
        cursor = {"cursor": int(state["cursor"]), "redo": [int(i) for i in state["redo"]],
                  "quarantine": state.get("quarantine")}
        warnings += repair_metrics(os.path.join(run_dir, "metrics.jsonl"), start)  # checks, then writes
        if rollback is not None:        # every check passed: now the roll-back may delete
            _delete_later(run_dir, rollback)
        _remove_after(os.path.join(run_dir, "batches"), start)
        if os.path.isdir(ckdir):
            for name in os.listdir(ckdir):
                if name.endswith((".partial", ".stale")):
                    shutil.rmtree(os.path.join(ckdir, name), ignore_errors=True)
        plan = RunPlan(run_dir, start, found.path, cursor, warnings=warnings, state=state)
    for sub in DIRS:
        os.makedirs(os.path.join(run_dir, sub), exist_ok=True)
    atomic_write(os.path.join(run_dir, "config.yaml"), cfg.to_yaml().encode())
    return plan
