"""Rows whose environment hangs: counted, and past `task.env_hang_limit` hangs kept out of the run.

A hang of a row is reported by its inference worker (`messages.EnvHung`): a blocking environment
call of one of its episodes abandoned past `task.env_timeout_s` (its thread still stuck), or the
call that blocked the worker's environment loop (the worker then restarts, `task.env_on_hang`).
An async call that timed out is not one (it was cancelled; nothing stays stuck).

Contract: `quarantine_for(cfg, task, state)`: the run's, on a multi-turn task (else None).
`Quarantine(limit, env_name, rows_in_data, state=None)` (the event thread's; `limit` 0:
nothing is ever quarantined). `hung(row, prompt_id, why) -> bool` counts one hang of dataset row
`row` (logged, naming the environment, the row and the prompt; a metrics event is the caller's),
true when that hang quarantined the row. `holds(row)`: the row is quarantined. A prompt of a
quarantined row is not generated: `skip(index, prompt_id)` records it (the cursor's next prompt,
or one a dead worker held), `take()` hands the skips since the last batch to the step line of the
batch being built (`quarantined_prompts`, the prompt ids, so `orchestrator.audit` counts them as
consumed; `rows_quarantined`, the rows so far), `consumed(skips)` once that step is trained, and
`unconsumed()` lists the stream indices skipped but not yet in a trained step line (a checkpoint
redoes them, so a resumed run skips them again and says so). `state_dict()` (hang counts and the
quarantined rows) is saved with each checkpoint and given back as `state` on resume: a row stays
quarantined across resume. When every row of the data is quarantined the run fails (`RunFailed`,
naming the environment): nothing is left to train on.
"""
from __future__ import annotations

import logging
from typing import Optional

from orchestrator.errors import RunFailed

log = logging.getLogger(__name__)


def quarantine_for(cfg, task, state: Optional[dict] = None) -> Optional["Quarantine"]:
    """The run's Quarantine: on a multi-turn task (an environment or an agent), else None."""
    from orchestrator.config import env_spec
    spec = cfg.task.agent or env_spec(cfg)
    if spec is None:
        return None
    rows = int(getattr(task, "identity", {}).get("prompts", 0))
    return Quarantine(cfg.task.env_hang_limit, str(spec), rows, state)


class Quarantine:
    def __init__(self, limit: int, env_name: str, rows_in_data: int, state: Optional[dict] = None):
        self.limit, self.env_name, self.rows_in_data = int(limit), env_name, int(rows_in_data)
        state = state or {}
        self.hangs: dict[int, int] = {int(r): int(n) for r, n in (state.get("hangs") or {}).items()}
        self.rows: set[int] = {int(r) for r in state.get("rows") or ()}
        self._new: list[tuple[int, int]] = []          # (index, prompt_id) skipped since take()
        self._open: set[int] = set()                   # indices skipped, not yet trained

    def hung(self, row: int, prompt_id: int, why: str) -> bool:
        if row < 0:
            return False
        self.hangs[row] = n = self.hangs.get(row, 0) + 1
        limit = f"task.env_hang_limit={self.limit}"
        log.warning("%s (hang %d of row %d; %s)", why, n, row,
                    limit if self.limit else "never quarantined: task.env_hang_limit=0")
        if not self.limit or n < self.limit or row in self.rows:
            return False
        self.rows.add(row)
        log.warning("row %d (prompt %d) quarantined: its environment %r hung %d times (%s); its "
                    "prompts are skipped from now on, across resume", row, prompt_id,
                    self.env_name, n, limit)
        if self.rows_in_data and len(self.rows) >= self.rows_in_data:
            raise RunFailed(f"every row of the data ({self.rows_in_data}) is quarantined: environment "
                            f"{self.env_name!r} hung {self.limit} times on each ({limit}); the "
                            f"last: {why}")
        return True

    def holds(self, row: int) -> bool:
        return row in self.rows

    def skip(self, index: int, prompt_id: int) -> None:
        self._new.append((index, prompt_id))
        self._open.add(index)

    def take(self) -> tuple[list[tuple[int, int]], dict]:
        """(the skips for this batch, its step-line fields)."""
        skips, self._new = self._new, []
        return skips, {"quarantined_prompts": [p for _, p in skips], "rows_quarantined": len(self.rows)}

    def consumed(self, skips: list[tuple[int, int]]) -> None:
        for index, _ in skips:
            self._open.discard(index)

    def unconsumed(self) -> list[int]:
        return sorted(self._open)

    def state_dict(self) -> dict:
        return {"hangs": {str(r): n for r, n in sorted(self.hangs.items())}, "rows": sorted(self.rows)}
