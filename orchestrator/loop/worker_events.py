"""The event loop's side of an inference worker's death and restart (a mixin of `EventLoop`).

- `worker_lost(i)`: a dead worker's in-flight prompts go back to the front of the in-queue (not
  counted as new admissions; a quarantined row's prompt is skipped instead), the hard age bound and
  the weight watcher forget it.
- `replace_worker_rings(i, req, out, ctl)`: the restarted worker's fresh rings.
- `_revive(i)`: the restarted worker said Ready: it loads the latest published weights first, then
  serves.
The state it reads is `EventLoop`'s (loop/event_loop.py); nothing here waits.
"""
from __future__ import annotations

import logging

from orchestrator import messages

log = logging.getLogger("orchestrator.loop.event_loop")


class WorkerEvents:
    def worker_lost(self, i: int) -> None:
        """An inference worker died: its in-flight prompts go back to the front of the in-queue."""
        q = self.cursor.quarantine
        for m in self.dispatcher.mark_dead(i):
            if self.bound is not None:
                self.bound.forget(m.request_id)
            if not m.eval:
                self.gate.on_aborted()
                if q is not None and q.holds(m.row):    # not redone: skipped, as the cursor would
                    index = self.request_index.pop(m.request_id, None)
                    if index is not None:
                        q.skip(index, m.prompt_id)
                    self._forget(m.request_id)
                    continue
                self.gate.on_enqueued()
                self.redispatched.add(m.request_id)
            self.dispatcher.enqueue(m, front=True)
        if self.bound is not None:
            self.bound.worker_lost(i)
        if self.watcher.forget_worker(i) is not None:
            self._on_synced()

    def replace_worker_rings(self, i: int, req, out, ctl) -> None:
        self.res.inference_req[i] = self.dispatcher.rings[i] = req
        self.res.inference_out[i] = out
        self.res.inference_ctl[i] = ctl

    def _revive(self, i: int) -> None:
        """A restarted worker is ready: load the latest published weights first, then serve."""
        version = self.counter.get()
        if self.res.weights.latest_version() >= 0 or version > 0:
            self.dispatcher.control(i, messages.LoadWeights(version=version))
        if self.bound is not None:            # a fresh process serves from exactly this version
            self.bound.restarted(i, version)
        self.dispatcher.live[i] = True
        log.info("inference worker %d back in rotation", i)
