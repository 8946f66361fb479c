"""Supervisor-side checkpoint files: the checkpoint directory protocol, validation, reuse.

A checkpoint at step k is written to `checkpoints/step_k.partial/` (supervisor.json: step, gate
counters, prompt cursor, prompts to redo, the resolved config, and per saved group its prompt
stream index, size and scalars; rollouts.rec: finished-but-untrained rollout groups as a
checksummed record file; the trainer writes trainer/ into it), none of it fsynced yet. `commit`
then fsyncs every file in it, writes MANIFEST.json (size and CRC32 of every file) last, renames the
directory to `step_k/` (replacing whatever a killed commit or a rolled-back run left under that
name) and names it in `checkpoints/latest`; every rename is followed by an fsync of its directory,
so a host crash leaves either the old or the new checkpoint. Last, it appends `{"step": k,
"keep_batches": N}` (the run.keep_batches of the config that wrote it) to
`checkpoints/retention.jsonl` (fsynced): batch files of steps <= k - N may be deleted from then on,
and `orchestrator.audit` reads this history to tell a pruned batch from a lost one.

Retention (`prune`, after each commit): the newest `run.keep_checkpoints` *valid* committed
checkpoints stay, and those whose step is a multiple of `run.keep_checkpoint_every`; a damaged one
never counts toward the kept number (one newer than the oldest kept stays, for inspection; one
older goes with the rest). An older one is renamed to `step_k.stale` (fsync) and removed, so a kill
mid-removal leaves a name no resume considers (the next resume deletes it). The newest valid
checkpoint, which is the one just committed (resume starts from the newest valid one, a roll-back
deletes later ones), is therefore always kept. Validity is checked as resume does (`validate`),
once per checkpoint and process: a checkpoint this process committed or validated is remembered
by its manifest's inode, mtime and size.

Resume never trusts `latest` alone: `find_resumable` validates checkpoints newest first (manifest,
sizes, checksums, supervisor.json) and returns the newest complete one, with a warning for every
damaged one it skipped. A kill at any instant of a commit therefore leaves a resumable run.
RNG: the trainer saves its torch RNG states with its weights and optimizer; inference sampling
streams derive from (run.seed, worker, restart, start step) (`backends.factory.sampling_seed`), so a
resumed run draws fresh, reproducible streams; prompts are a pure function of their stream index.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from orchestrator.run.durable import (RecordError, append_line, atomic_write, fsync_dir, read_record,
                                      write_record)
from shm.codec import CodecError, Sequences, concat, decode, encode

MANIFEST = "MANIFEST.json"
STATE = "supervisor.json"
ROLLOUTS = "rollouts.rec"
RETENTION = "retention.jsonl"
_NAME = re.compile(r"step_(\d{8})\Z")
_CRC_CHUNK = 8 << 20
_STATE_KEYS = {"step": int, "cursor": int, "redo": list, "gate": dict}
_VALID: dict[str, tuple] = {}     # checkpoint path -> its manifest's (inode, mtime, size) when valid


class CheckpointError(ValueError):
    """A checkpoint directory is incomplete or damaged (the message names the file)."""


def slice_group(s: Sequences, start: int, n: int) -> Sequences:
    """Sequences [start, start+n) of a record, as a new record (copies)."""
    lo, hi = int(s.offsets[start]), int(s.offsets[start + n])
    return Sequences(kind=s.kind, ident=s.ident, version=s.version,
                     offsets=(s.offsets[start:start + n + 1] - lo).copy(),
                     prompt_lens=s.prompt_lens[start:start + n].copy(),
                     prompt_ids=s.prompt_ids[start:start + n].copy(),
                     tokens=s.tokens[lo:hi].copy(), logprobs=s.logprobs[lo:hi].copy(),
                     versions=s.versions[lo:hi].copy(), loss_mask=s.loss_mask[lo:hi].copy(),
                     rewards=s.rewards[start:start + n].copy(),
                     advantages=s.advantages[start:start + n].copy(), scalars=s.scalars.copy())


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def begin(run_dir: str, step: int) -> str:
    tmp = os.path.join(run_dir, "checkpoints", step_name(step) + ".partial")
    if os.path.lexists(tmp):               # a killed earlier attempt at the same step
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    return tmp


def write_state(tmp: str, state: dict, finished: list[tuple[int, Sequences]]) -> None:
    """`finished`: (prompt stream index, group) of every finished-but-untrained rollout. The
    record holds their sequences; `reuse` lists [index, size, scalars] per group (the record's
    own scalars are per record, so each group's reward errors and episode fields live here)."""
    if finished:
        groups = [g for _, g in finished]
        write_record(os.path.join(tmp, ROLLOUTS),          # fsynced by commit, with the rest
                     encode(concat(groups, kind=0, ident=state["step"], version=-1)), durable=False)
    state = dict(state, reuse=[[index, g.n, g.scalars.tolist()] for index, g in finished])
    atomic_write(os.path.join(tmp, STATE), json.dumps(state).encode(), durable=False)


def _crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(p for p in out if p != MANIFEST)


def commit(tmp: str) -> str:
    """Seal `step_k.partial` (fsync, manifest) and make it `step_k`, named by `latest`."""
    entries = {}
    for rel in _files(tmp):
        path = os.path.join(tmp, rel)
        with open(path, "rb") as f:          # the trainer's writers need not fsync: we do
            os.fsync(f.fileno())
        entries[rel] = [os.path.getsize(path), _crc(path)]
    for d, _, _ in os.walk(tmp):
        fsync_dir(d)
    atomic_write(os.path.join(tmp, MANIFEST), json.dumps({"files": entries}).encode())
    final = tmp[: -len(".partial")]
    parent = os.path.dirname(final)
    if os.path.lexists(final):               # left by a killed commit or a rolled-back run
        stale = final + ".stale"
        if os.path.lexists(stale):
            shutil.rmtree(stale)
        os.replace(final, stale)
        fsync_dir(parent)
        shutil.rmtree(stale)
    os.replace(tmp, final)
    fsync_dir(parent)
    atomic_write(os.path.join(parent, "latest"), os.path.basename(final).encode())
    _remember(final)
    state = read_state(final)
    keep = ((state.get("config") or {}).get("run") or {}).get("keep_batches")
    append_line(os.path.join(parent, RETENTION),
                json.dumps({"step": state["step"], "keep_batches": keep}).encode())
    return final


def read_state(checkpoint: str) -> dict:
    path = os.path.join(checkpoint, STATE)
    try:
        with open(path, "rb") as f:
            state = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is unreadable ({type(exc).__name__})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} does not hold an object")
    for key, typ in _STATE_KEYS.items():
        if not isinstance(state.get(key), typ) or isinstance(state.get(key), bool):
            raise CheckpointError(f"{path}: field '{key}' is missing or not {typ.__name__}")
    return state


def validate(checkpoint: str) -> dict:
    """Check a committed checkpoint against its manifest; return its supervisor state."""
    mpath = os.path.join(checkpoint, MANIFEST)
    try:
        with open(mpath, "rb") as f:
            files = json.loads(f.read().decode("utf-8"))["files"]
        files = {str(k): (int(v[0]), int(v[1])) for k, v in files.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise CheckpointError(f"{mpath} is missing or unreadable ({type(exc).__name__})") from None
    for rel, (size, crc) in files.items():
        path = os.path.join(checkpoint, rel)
        try:
            ok_size = os.path.getsize(path) == size
        except OSError:
            raise CheckpointError(f"{path} is missing") from None
        if not ok_size or _crc(path) != crc:
            raise CheckpointError(f"{path} is damaged (size or checksum differs from {MANIFEST})")
    state = read_state(checkpoint)
    if state.get("reuse") and ROLLOUTS not in files:
        raise CheckpointError(f"{os.path.join(checkpoint, ROLLOUTS)} is missing")
    return state


@dataclass
class Found:
    path: Optional[str]                 # newest complete checkpoint, or None
    state: Optional[dict]
    skipped: list[str] = field(default_factory=list)   # one line per damaged checkpoint passed over


def committed(run_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every committed checkpoint directory, newest first."""
    ckdir = os.path.join(run_dir, "checkpoints")
    try:
        names = os.listdir(ckdir)
    except FileNotFoundError:
        return []
    out = [(int(m.group(1)), os.path.join(ckdir, n)) for n in names if (m := _NAME.match(n))]
    return sorted(out, reverse=True)


def _signature(path: str) -> tuple:
    st = os.stat(os.path.join(path, MANIFEST))
    return st.st_ino, st.st_mtime_ns, st.st_size


def _remember(path: str) -> None:
    """`path` is a valid checkpoint (just committed or validated): prune need not check it again."""
    _VALID[path] = _signature(path)


def _is_valid(step: int, path: str) -> bool:
    try:
        if _VALID.get(path) == _signature(path):
            return True
        if validate(path)["step"] != step:
            return False
    except (OSError, CheckpointError):
        return False
    _remember(path)
    return True


def prune(run_dir: str, keep: Optional[int], every: Optional[int] = None) -> list[int]:
    """Delete committed checkpoints past the retention policy (module docstring); their steps."""
    if keep is None:
        return []
    removed, valid = [], 0
    for step, path in committed(run_dir):       # newest first
        if valid < keep:                        # within the window: kept; counted if valid
            valid += _is_valid(step, path)
            continue
        if every and step % every == 0:
            continue
        stale = path + ".stale"
        if os.path.lexists(stale):
            shutil.rmtree(stale)
        os.replace(path, stale)
        fsync_dir(os.path.dirname(path))
        _VALID.pop(path, None)
        shutil.rmtree(stale)
        removed.append(step)
    return removed


def find_resumable(run_dir: str, at_most: Optional[int] = None) -> Found:
    """Newest valid checkpoint (at step <= at_most when given); damaged ones are skipped."""
    skipped = []
    for step, path in committed(run_dir):
        if at_most is not None and step > at_most:
            continue
        try:
            state = validate(path)
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        if state["step"] != step:
            skipped.append(f"{os.path.join(path, STATE)} says step {state['step']}")
            continue
        _remember(path)
        return Found(path, state, skipped)
    return Found(None, None, skipped)


def load_finished(checkpoint: str, state: dict) -> list[tuple[int, Sequences]]:
    reuse = state.get("reuse", [])
    if not reuse:
        return []
    path = os.path.join(checkpoint, ROLLOUTS)
    try:
        saved = decode(read_record(path))
    except (OSError, RecordError, CodecError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    out, start = [], 0
    for index, n, *scalars in reuse:      # checkpoints from before per-group scalars: [index, n]
        group = slice_group(saved, start, n)
        if scalars:
            group.scalars = np.asarray(scalars[0], np.float64)
        out.append((int(index), group))
        start += n
    if start != saved.n:
        raise CheckpointError(f"{path} holds {saved.n} rollouts, supervisor.json lists {start}")
    return out
