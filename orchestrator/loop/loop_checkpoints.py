"""The event loop's checkpoint requests and what a resume takes back (a mixin of `EventLoop`).

- `request_checkpoint(step)`: hands `CheckpointBook.request` the loop's state (gate, prompt cursor,
  prompts to redo, seed, data identity, config, quarantine) and its finished-but-untrained rollouts
  (parked batches' groups and the sink's pending ones; deterministic: what dynamic sampling kept out
  too, each where it was fed).
- `_checkpoint_when_ready()`: run.deterministic defers a checkpoint until the schedule's
  `checkpoint_ready` (the batches after it are built); a stop request drops it (the drain takes
  its own).
- `reuse_rollouts(ckpt_dir, state)`: after a resume, feeds saved rollouts still within the bound
  (`checkpoints.reusable`) straight to the sink; the rest are regenerated.
The state it reads is `EventLoop`'s (loop/event_loop.py); nothing here waits.
"""
from __future__ import annotations

import logging
from collections import deque

from orchestrator.loop.checkpoints import reusable
from orchestrator.run import checkpoint

log = logging.getLogger("orchestrator.loop.event_loop")


class LoopCheckpoints:
    def _checkpoint_when_ready(self) -> None:
        """run.deterministic: request the deferred checkpoint once `checkpoint_ready`."""
        d = self.det
        if d is None or d.ckpt_due is None:
            return
        if self.stop_requested:
            d.ckpt_due = None                 # a drain takes its own checkpoint
        elif d.schedule.checkpoint_ready(d.ckpt_due, self.built):
            step, d.ckpt_due = d.ckpt_due, None
            self.request_checkpoint(step)

    def request_checkpoint(self, step: int) -> None:
        if self.det is None:
            finished = [g for p in self.parked for g in p.info.parts] + list(self.sink.pending)
        else:      # deterministic: what dynamic sampling kept out too, each where it was fed
            finished = [g for p in self.parked for g in p.info.filtered + p.info.parts] \
                + self.sink.filtered + list(self.sink.pending)
        redo = sorted(set(self.request_index.values()))
        q = self.cursor.quarantine            # its skips not yet in a trained step: redone too
        self.ckpts.request(step, {
            "gate": self.gate.state_dict(), "cursor": self.cursor.cursor,
            "redo": redo + list(self.cursor.redo) + (q.unconsumed() if q is not None else []),
            "seed": self.cfg.run.seed, "data": self.task.identity,
            "config": self.cfg.model_dump(mode="json"),
            **({"quarantine": q.state_dict()} if q is not None else {})},
            [(self.request_index[g.ident], g) for g in finished])

    def reuse_rollouts(self, ckpt_dir: str, state: dict) -> None:
        """After `on_version_recovered`: finished-but-untrained rollouts saved with the checkpoint
        go straight to the sink when their head is within the bound (`checkpoints.reusable`) and
        the gate has room; the rest are regenerated. A deterministic run resumed from a
        deterministic run's checkpoint feeds every one, in the saved order."""
        finished = checkpoint.load_finished(ckpt_dir, state)
        version, r = self.counter.get(), self.cfg.rollout
        redo = []
        saved_det = bool(state.get("config", {}).get("run", {}).get("deterministic"))
        for index, part in finished:     # deterministic: each, as it was fed (loop.lockstep)
            if (self.det is not None and saved_det) or (
                    reusable(part, version, r.max_head_offpolicyness, self.episode_tokens,
                             r.max_new_tokens) and self.gate.capacity() > 0):
                part.ident = self._new_request(index)
                self.gate.on_enqueued()
                self.gate.on_submitted()
                self.gate.on_accepted()
                self._to_sink(part)
                self.reused += 1
            else:
                redo.append(index)
        self.cursor.redo = deque(sorted(set(self.cursor.redo) - {i for i, _ in finished} | set(redo)))
        log.info("reused %d of %d finished rollouts from %s", self.reused, len(finished), ckpt_dir)
