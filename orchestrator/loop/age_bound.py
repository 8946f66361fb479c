"""The hard age bound (`rollout.max_observed_offpolicyness` = M): no trained token's head is older
than M, under any latency distribution. The admission gate bounds how far ahead prompts are
admitted; it cannot stop a long-tail rollout from finishing many versions later. This does.

Contract (`AgeBound(M, workers, version)`, owned by the event loop, which acts on its answers):
- Heads of rollouts in flight are bounded from below without asking the workers: a worker handles
  its ring in order and loads weights synchronously, so every token of a request is sampled at or
  after the last `LoadWeights(v)` sent on that worker's ring before the request. `weights_sent`
  records those versions, `dispatched` gives each request its floor.
- Batch k trains at version k-1, so a rollout that lands in a batch built after step `built` is
  trained at version >= built. `doomed(built)`: the requests in flight whose floor is below
  built - M, which can no longer meet the bound: the loop aborts them on their workers and
  re-admits their prompts (counted as rejections: the gate frees their capacity, AReaL's semantics).
  `can_start(built, workers)`: admission waits while no live worker's floor could meet the bound
  (with M below the gate's S, that is what keeps rollouts from being aborted at birth).
  The floor never exceeds the true head, so no rollout that would violate the bound escapes; one
  that waited in a worker's queue past a reload may be aborted although it would have met it.
- `too_old(group, version)`: a finished group whose head (oldest loss-masked live token) is below
  version - M; the loop drops it before it enters a batch of that version and re-admits its prompt.
  Groups without live tokens (replayed, external) carry no age and are never dropped.
- Per request, everything is released when the request ends: `floor` when it finishes, is put back
  or is aborted; an aborted id (`aborted_ids`: a result may still arrive) when its worker answers the
  Abort (`abort_done`: nothing of it will come, or its late result arrived), or its worker dies
  (`worker_lost`). `pending_aborts()` is how many await that answer (bounded by what was in flight).
- Counters since the last step line: `aborted` (rollouts aborted in flight), `dropped` (finished
  groups dropped), `wasted_tokens` (loss-masked tokens of dropped groups and of aborted rollouts
  whose result arrived anyway); `take_counts()` returns and resets them, with `aborts_pending`.

`enforce(bound, version, dispatcher, gate, sink)` is the loop's action on those answers before it
builds a batch at `version`: doomed requests are cancelled and aborted on their workers (never
waiting on one: `Dispatcher.control`) and counted as rejections; finished groups too old for the
batch leave the sink and are counted as dropped. It returns the request ids whose prompts the loop
admits again.
"""
from __future__ import annotations

from typing import Optional

from orchestrator import messages
from orchestrator.algo.stamp import group_head
from shm.codec import Sequences


class AgeBound:
    def __init__(self, max_age: int, workers: int, version: int):
        self.max_age = max_age
        self.sent = [version] * workers           # last LoadWeights version put on each ring
        self.floor: dict[int, int] = {}           # request id in flight -> lower bound of its head
        self.worker: dict[int, int] = {}          # request id in flight -> its worker
        self.aborted_ids: dict[int, int] = {}     # aborted, not over yet -> its worker
        self._result_seen: set[int] = set()       # aborted ones whose late result arrived
        self._answer_seen: set[int] = set()       # aborted ones whose worker said a result was sent
        self._heads: dict[int, Optional[int]] = {}  # finished group id -> its head (computed once)
        self.aborted = self.dropped = self.wasted_tokens = 0

    def weights_sent(self, workers, version: int) -> None:
        for w in workers:
            self.sent[w] = max(self.sent[w], version)

    def restarted(self, worker: int, version: int) -> None:
        """A restarted worker's process: the version it serves from is exactly `version`."""
        self.sent[worker] = version

    def dispatched(self, request_id: int, worker: int) -> None:
        self.floor[request_id] = self.sent[worker]
        self.worker[request_id] = worker

    def forget(self, request_id: int) -> None:
        """Not in flight any more (finished, or put back in the queue after its worker died)."""
        self.floor.pop(request_id, None)
        self.worker.pop(request_id, None)

    def abort_done(self, request_id: int, result_sent: bool) -> None:
        """The worker answered the Abort: with no result sent the request is over; with one, it is
        over once that result arrives (`late_result`), which may have happened already."""
        if request_id not in self.aborted_ids:
            return
        if result_sent and request_id not in self._result_seen:
            self._answer_seen.add(request_id)   # its result is still on the way (another ring)
        else:
            self._end(request_id)

    def _end(self, request_id: int) -> None:
        del self.aborted_ids[request_id]
        self._result_seen.discard(request_id)
        self._answer_seen.discard(request_id)

    def worker_lost(self, worker: int) -> None:
        """A worker died: no answer or late result of its aborted requests will be read."""
        for rid in [r for r, w in self.aborted_ids.items() if w == worker]:
            self._end(rid)

    def pending_aborts(self) -> int:
        return len(self.aborted_ids)

    def can_start(self, built: int, workers) -> bool:
        """Whether a prompt admitted now could meet the bound on some live worker (its floor would
        be that ring's last load, and it lands in a batch of version >= built). Admission waits
        while none could: a rollout doomed at birth would only be aborted."""
        return any(self.sent[w] >= built - self.max_age for w in workers)

    def doomed(self, built: int) -> list[int]:
        limit = built - self.max_age
        out = [rid for rid, f in self.floor.items() if f < limit]
        for rid in out:
            del self.floor[rid]
            self.aborted_ids[rid] = self.worker.pop(rid)
        self.aborted += len(out)
        return out

    def too_old(self, group: Sequences, version: int) -> bool:
        """Asked for every pending group on every turn of the loop: the head is computed once per
        group (`_heads`, forgotten when the group leaves)."""
        if group.ident not in self._heads:
            self._heads[group.ident] = group_head(group.versions, group.loss_mask)
        head = self._heads[group.ident]
        if head is None or version - head <= self.max_age:
            return False
        del self._heads[group.ident]
        self.dropped += 1
        self.wasted_tokens += int(group.loss_mask.sum())
        return True

    def trained(self, group: Sequences) -> None:
        """The group went into a batch: its cached head is not needed any more."""
        self._heads.pop(group.ident, None)

    def late_result(self, group: Sequences) -> bool:
        """A result of an aborted request (it finished before the abort reached its worker): its
        tokens are wasted; the caller discards it."""
        rid = group.ident
        if rid not in self.aborted_ids or rid in self._result_seen:
            return False
        self.wasted_tokens += int(group.loss_mask.sum())
        if rid in self._answer_seen:        # answered already: the request ends here
            self._end(rid)
        else:                               # the answer is still on the way
            self._result_seen.add(rid)
        return True

    def take_counts(self) -> dict[str, int]:
        out = {"aborted": self.aborted, "dropped": self.dropped, "wasted_tokens": self.wasted_tokens,
               "aborts_pending": self.pending_aborts()}
        self.aborted = self.dropped = self.wasted_tokens = 0
        return out


def enforce(bound: AgeBound, version: int, dispatcher, gate, sink) -> list[int]:
    readmit = []
    for rid in bound.doomed(version):
        entry = dispatcher.cancel(rid)
        if entry is not None:
            dispatcher.control(entry[0], messages.Abort(request_id=rid))
        gate.on_rejected()
        readmit.append(rid)
    keep = []
    for g in sink.pending:
        if bound.too_old(g, version):
            gate.on_dropped()
            readmit.append(g.ident)
        else:
            keep.append(g)
    sink.pending = keep
    return readmit
