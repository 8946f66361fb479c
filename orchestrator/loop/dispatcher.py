"""Dispatcher: in-queue of admitted prompts, out-queue of finished groups, pause/resume.

It knows workers only as request rings and load counts; it does not know the gate or the sinks.
`pump()` moves prompts from the in-queue to the least-loaded live worker, or to the one it was pinned
to (`enqueue(msg, worker=i)`, run.deterministic's waves; a worker's death unpins its prompts and
clears their `hold`), never while paused, never blocking (a full ring leaves the prompt queued),
and returns what it submitted, so the caller can account for it. Finished groups are appended to
the out-queue in completion order.

Nothing here blocks on a worker: control messages (`control(worker, msg)`: LoadWeights, Abort;
`broadcast(msg)` to every live worker) go to a per-worker outbox that `flush()` (called by `pump()`,
paused or not) moves onto the worker's ring without waiting; a worker whose outbox is not empty gets
no new prompt, so each ring still carries every message in the order it was issued (the hard age
bound relies on a request following every LoadWeights issued before it). A stalled worker's
outbox holds at most its aborts and the reloads issued meanwhile until the liveness or progress
deadline replaces it; `mark_dead` drops it.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

from orchestrator import messages
from orchestrator.wire import send


class Dispatcher:
    def __init__(self, rings: list, queue_size: int):
        self.rings = list(rings)
        self.queue_size = queue_size
        self.in_queue: deque[messages.Generate] = deque()
        self.out_queue: deque = deque()
        self.inflight: dict[int, tuple[int, messages.Generate]] = {}   # request_id -> (worker, msg)
        self.load = [0] * len(self.rings)
        self.live = [True] * len(self.rings)
        self.outbox: list[deque[messages.Msg]] = [deque() for _ in self.rings]
        self.paused = False
        self.pinned: dict[int, int] = {}      # request id -> the one worker it may go to

    # ---------------------------------------------------------------- input side
    def enqueue(self, msg: messages.Generate, front: bool = False,
                worker: Optional[int] = None) -> None:
        """Queue a prompt; `worker`: it goes to that worker only (run.deterministic's waves)."""
        (self.in_queue.appendleft if front else self.in_queue.append)(msg)
        if worker is not None:
            self.pinned[msg.request_id] = worker

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def _pick(self) -> Optional[int]:
        best = None
        for i, ok in enumerate(self.live):
            if ok and not self.outbox[i] and (best is None or self.load[i] < self.load[best]):
                best = i
        return best

    def pump(self) -> list[messages.Generate]:
        self.flush()
        submitted = []
        while self.in_queue and not self.paused:
            w = self._pick()
            if w is None:
                break
            msg = self.in_queue[0]
            pin = self.pinned.get(msg.request_id)
            if pin is not None:               # in order: a pinned prompt waits for its worker
                if self.outbox[pin]:
                    break
                w = pin
            try:
                send(self.rings[w], msg, timeout=0.0)
            except TimeoutError:
                break
            self.in_queue.popleft()
            self.pinned.pop(msg.request_id, None)
            self.inflight[msg.request_id] = (w, msg)
            self.load[w] += 1
            submitted.append(msg)
        return submitted

    # ---------------------------------------------------------------- output side
    def finished(self, request_id: int, item) -> Optional[messages.Generate]:
        """Record a finished request; returns its Generate message (None if unknown)."""
        entry = self.inflight.pop(request_id, None)
        if entry is None:
            return None
        self.load[entry[0]] -= 1
        if item is not None:
            self.out_queue.append(item)
        return entry[1]

    def cancel(self, request_id: int) -> Optional[tuple[int, messages.Generate]]:
        """Forget an in-flight request (the caller aborts it on its worker): (worker, message), or
        None when it is not in flight."""
        entry = self.inflight.pop(request_id, None)
        if entry is not None:
            self.load[entry[0]] -= 1
        return entry

    def out_queue_full(self) -> bool:
        return len(self.out_queue) >= self.queue_size

    # ---------------------------------------------------------------- workers
    def control(self, worker: int, msg: messages.Msg) -> None:
        """Queue a control message for `worker` (ahead of any later prompt) and try to send it."""
        self.outbox[worker].append(msg)
        self.flush(worker)

    def broadcast(self, msg: messages.Msg) -> None:
        for i, ok in enumerate(self.live):
            if ok:
                self.control(i, msg)

    def flush(self, worker: Optional[int] = None) -> int:
        """Move queued control messages onto their rings, in order, without waiting."""
        n = 0
        for i in range(len(self.rings)) if worker is None else (worker,):
            box = self.outbox[i]
            while box:
                try:
                    send(self.rings[i], box[0], timeout=0.0)
                except TimeoutError:
                    break
                box.popleft()
                n += 1
        return n

    def mark_dead(self, worker: int) -> list[messages.Generate]:
        """Take a worker out of rotation; return its in-flight requests (for re-dispatch). Its
        queued control messages are dropped (its restart gets fresh rings and its own reload)."""
        self.live[worker] = False
        self.outbox[worker].clear()
        lost = [m for rid, (w, m) in list(self.inflight.items()) if w == worker]
        for m in lost:
            del self.inflight[m.request_id]
        for m in lost + [m for m in self.in_queue if self.pinned.get(m.request_id) == worker]:
            self.pinned.pop(m.request_id, None)     # they go wherever there is room, and nobody
            m.hold = False                          # waits for the rest of a wave that is gone
        self.load[worker] = 0
        return lost

    def depths(self) -> dict[str, int]:
        return {"in_queue": len(self.in_queue), "out_queue": len(self.out_queue),
                "inflight": len(self.inflight), "outbox": sum(len(b) for b in self.outbox)}
