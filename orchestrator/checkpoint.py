"""Supervisor-side checkpoint files: atomic writes, the checkpoint directory protocol, reuse.

A checkpoint at step k is written to `checkpoints/step_k.partial/` (supervisor.json: step, gate
counters, prompt cursor, prompts to redo; rollouts.rec: finished-but-untrained rollout groups; the
trainer writes trainer/ into it), then renamed to `step_k/` and named in `checkpoints/latest`, each
by an atomic rename. A kill at any moment leaves the previous complete checkpoint in force.
RNG: the trainer saves its torch RNG states with its weights and optimizer; inference sampling
streams derive from (run.seed, worker, restart, start step) (`backends.factory.sampling_seed`), so a
resumed run draws fresh, reproducible streams; prompts are a pure function of their stream index.
"""
from __future__ import annotations

import json
import os

from shm.codec import Sequences, concat, decode, encode


def atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


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


def begin(run_dir: str, step: int) -> str:
    tmp = os.path.join(run_dir, "checkpoints", f"step_{step:08d}.partial")
    os.makedirs(tmp, exist_ok=True)
    return tmp


def write_state(tmp: str, state: dict, finished: list[tuple[int, Sequences]]) -> None:
    """`finished`: (prompt stream index, group) of every finished-but-untrained rollout."""
    if finished:
        groups = [g for _, g in finished]
        atomic_write(os.path.join(tmp, "rollouts.rec"),
                     bytes(encode(concat(groups, kind=0, ident=state["step"], version=-1))))
    state = dict(state, reuse=[[index, g.n] for index, g in finished])
    atomic_write(os.path.join(tmp, "supervisor.json"), json.dumps(state).encode())


def commit(tmp: str) -> str:
    final = tmp[: -len(".partial")]
    os.replace(tmp, final)
    atomic_write(os.path.join(os.path.dirname(final), "latest"), os.path.basename(final).encode())
    return final


def load_finished(checkpoint: str) -> list[tuple[int, Sequences]]:
    state = json.load(open(os.path.join(checkpoint, "supervisor.json")))
    reuse = state.get("reuse", [])
    if not reuse:
        return []
    with open(os.path.join(checkpoint, "rollouts.rec"), "rb") as f:
        saved = decode(f.read())
    out, start = [], 0
    for index, n in reuse:
        out.append((int(index), slice_group(saved, start, n)))
        start += n
    return out
