"""loop.quarantine and the cursor's skips: hangs counted per row, quarantined at the limit (never
at 0), skipped prompts handed to a batch and redone until trained, the state round-tripped as a
checkpoint keeps it, and a run whose every row is quarantined fails naming the environment."""
import numpy as np
import pytest

from orchestrator.errors import RunFailed
from orchestrator.loop.prompts import PromptCursor
from orchestrator.loop.quarantine import Quarantine


class Rows:
    """A prompt stream over 3 rows: index i is row i % 3, prompt id i."""

    def train_prompt(self, index):
        return index, np.array([index], np.int32), index % 3


def test_a_row_is_quarantined_at_its_limit_and_its_prompts_skipped_until_trained():
    q = Quarantine(2, "env.py:E", 3)
    cursor = PromptCursor(Rows(), quarantine=q)
    assert not q.hung(1, 4, "step() of environment 'env.py:E' for row 1 (prompt 4) blocked")
    assert [cursor.next()[0] for _ in range(3)] == [0, 1, 2]          # one hang: still served
    assert q.hung(1, 7, "again")                                       # the second: quarantined
    assert not q.hung(1, 7, "once more")                               # already out
    assert [cursor.next()[0] for _ in range(4)] == [3, 5, 6, 8]        # 4 and 7 skipped
    skips, fields = q.take()
    assert skips == [(4, 4), (7, 7)] and fields == {"quarantined_prompts": [4, 7], "rows_quarantined": 1}
    assert q.unconsumed() == [4, 7]                # not yet trained: a checkpoint redoes them
    q.consumed(skips)
    assert q.unconsumed() == [] and q.take()[0] == []

    resumed = Quarantine(2, "env.py:E", 3, state=q.state_dict())       # through a checkpoint
    assert resumed.holds(1) and resumed.hangs == {1: 3}
    cursor = PromptCursor(Rows(), cursor=9, redo=[4], quarantine=resumed)
    assert cursor.next()[0] == 9 and resumed.take()[0] == [(4, 4)]     # the redone skip, said again


def test_limit_zero_never_quarantines_and_every_row_out_fails_the_run():
    q = Quarantine(0, "env.py:E", 3)
    assert not any(q.hung(0, 0, "hung") for _ in range(5)) and not q.holds(0)
    q = Quarantine(1, "env.py:E", 2)
    assert q.hung(0, 0, "first")
    with pytest.raises(RunFailed, match=r"every row of the data \(2\) is quarantined: environment "
                                        r"'env.py:E' hung 1 times on each"):
        q.hung(1, 1, "second")
