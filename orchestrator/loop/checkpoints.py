"""The event thread's side of checkpoints: request, commit when durable, prune; what a resume takes back.

`CheckpointBook(run_dir, run_cfg, metrics, trainer_req, start_step)`:
- `request(step, state, finished)`: begins checkpoint `step` (`checkpoint.begin`), writes the loop's
  state and its finished-but-untrained rollouts (`checkpoint.write_state`), and asks the trainer to
  save into it (`SaveCheckpoint` on its request ring). Never waits on the trainer.
- `saved(step, lines_written)`: the trainer's `CheckpointSaved` arrived; `commit_ready(lines_written)`
  commits every saved checkpoint whose step lines are written, after making those lines and the
  persisted batches (`note_batch`) durable: a checkpoint never covers a step whose line or batch a
  kill or a host crash could still lose. After a commit, checkpoints past `run.keep_checkpoints` are
  pruned (`checkpoint.prune`) and, with `run.keep_batches`, batch files that many steps older than
  the committed one are deleted (`batches_pruned`: every batch file up to it is gone).
- `idle`: nothing requested or saved is waiting for its commit.

`reusable(part, version, max_staleness, episode_tokens, max_new_tokens)`: whether a finished rollout
saved with a checkpoint can be trained after a resume at `version`: its oldest loss-masked token is
within the staleness bound, and every sample fits today's budgets (a resume may have lowered them).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Optional

from orchestrator import messages
from orchestrator.algo.stamp import stamp
from orchestrator.observe.metrics import MetricsLog
from orchestrator.run import checkpoint
from orchestrator.run.durable import sync_files
from orchestrator.wire import send

log = logging.getLogger("orchestrator.loop.checkpoints")


class CheckpointBook:
    def __init__(self, run_dir: str, run_cfg, metrics: MetricsLog, trainer_req, start_step: int = 0):
        self.run_dir, self.run, self.metrics, self.trainer_req = run_dir, run_cfg, metrics, trainer_req
        self.pending: dict[int, str] = {}       # requested, the trainer has not saved yet
        self.to_commit: dict[int, str] = {}     # saved, committed once its step lines are durable
        self.unsynced: list[str] = []           # batch files not fsynced yet (synced at commit)
        self.last_ckpt = start_step
        self.batches_pruned = 0                 # batch files of steps <= this are deleted

    @property
    def idle(self) -> bool:
        return not self.pending and not self.to_commit

    def note_batch(self, path: str) -> None:
        self.unsynced.append(path)

    def request(self, step: int, state: dict, finished: list) -> None:
        tmp = checkpoint.begin(self.run_dir, step)
        checkpoint.write_state(tmp, {**state, "step": step, "version": step, "time": time.time()},
                               finished)
        send(self.trainer_req, messages.SaveCheckpoint(step=step, directory=os.path.join(tmp, "trainer")))
        self.pending[step] = tmp

    def saved(self, step: int, lines_written: int) -> None:
        tmp = self.pending.pop(step, None)
        if tmp is not None:
            self.to_commit[step] = tmp
            self.commit_ready(lines_written)

    def commit_ready(self, lines_written: int) -> None:
        ready = [s for s in sorted(self.to_commit) if s <= lines_written]
        if not ready:
            return
        self.metrics.sync()
        sync_files(self.unsynced)         # the batches it covers, too (one fsync per file, here)
        self.unsynced.clear()
        for step in ready:
            checkpoint.commit(self.to_commit.pop(step))
            self.last_ckpt = max(self.last_ckpt, step)
        run = self.run
        removed = checkpoint.prune(self.run_dir, run.keep_checkpoints, run.keep_checkpoint_every)
        if removed:
            log.info("removed checkpoints of steps %s (run.keep_checkpoints=%s)", removed,
                     run.keep_checkpoints)
        if run.keep_batches is not None:    # covered by a committed checkpoint: no resume needs them
            upto = self.last_ckpt - run.keep_batches
            for k in range(self.batches_pruned + 1, upto + 1):
                try:
                    os.remove(os.path.join(self.run_dir, "batches", f"step_{k:08d}.rec"))
                except FileNotFoundError:
                    pass
            self.batches_pruned = max(self.batches_pruned, upto)


def reusable(part, version: int, max_staleness: int, episode_tokens: Optional[int],
             max_new_tokens: int) -> bool:
    heads = [st.head for i in range(part.n)
             if (st := stamp(part.versions[part.seq(i)], part.loss_mask[part.seq(i)]))]
    if episode_tokens is not None:          # multi-turn: the episode budget
        fits = all(part.seq(i).stop - part.seq(i).start <= episode_tokens for i in range(part.n))
    else:
        fits = all(part.seq(i).stop - part.seq(i).start - int(part.prompt_lens[i]) <= max_new_tokens
                   for i in range(part.n))
    return bool(heads) and fits and version - min(heads) <= max_staleness
