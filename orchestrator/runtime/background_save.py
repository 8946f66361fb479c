"""Checkpoints off the trainer's critical path: one writer thread, at most one save at a time.

Contract (`BackgroundSave()`, used by the trainer worker's main thread only):
- `start(write, step, directory)`: run `write(directory)` (a backend's `snapshot()`: the state was
  copied when it was taken, so training may go on) in a daemon thread. A save still running is
  waited for first (`wait`), so saves finish in the order they were taken.
- `done()`: the (step, directory) of every save that finished since the last call, in order; a
  save that raised re-raises here, on the main thread (a full disk fails the run as a synchronous save
  would). The caller reports it (CheckpointSaved) from the main thread, the ring's only writer.
- `wait(beat)`: block until no save runs, calling `beat()` about every second (the progress
  deadline keeps counting only real hangs); then `done()` tells what finished.
The supervisor commits a checkpoint only after CheckpointSaved; a kill before that leaves a
`.partial` directory that resume ignores, so a background save is as crash-safe as a synchronous one.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

WAIT_SLICE_S = 1.0


class BackgroundSave:
    def __init__(self):
        self._thread: Optional[threading.Thread] = None
        self._what: Optional[tuple[int, str]] = None
        self._error: Optional[BaseException] = None
        self._finished: list[tuple[int, str]] = []

    def start(self, write: Callable[[str], None], step: int, directory: str,
              beat: Callable[[], None] = lambda: None) -> None:
        self.wait(beat)

        def run() -> None:
            try:
                write(directory)
            except BaseException as exc:      # re-raised on the main thread by done()
                self._error = exc

        self._what = (step, directory)
        self._thread = threading.Thread(target=run, name=f"save-step{step}", daemon=True)
        self._thread.start()

    def _reap(self) -> None:
        if self._thread is not None and not self._thread.is_alive():
            self._thread.join()
            self._thread = None
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            self._finished.append(self._what)
            self._what = None

    def done(self) -> list[tuple[int, str]]:
        self._reap()
        out, self._finished = self._finished, []
        return out

    def wait(self, beat: Callable[[], None] = lambda: None) -> None:
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(WAIT_SLICE_S)
            beat()
        self._reap()

    @property
    def running(self) -> bool:
        return self._thread is not None
