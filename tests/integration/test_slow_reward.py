"""A slow reward on the default job (#38 item 2), through real launches: configs/default.yaml scores
inline (`task.reward_workers: 0`), and a user reward that sleeps 20 s on one call used to hold the
inference worker's main thread past its heartbeat timeout (killed, restarted, exit 1 naming
nothing). Every call is bounded by `task.reward_timeout_s` whatever `task.reward_workers` is:
`reward_on_error=fail` is exit 2 naming the function and the row; `zero` finishes the run with the
call counted in a step line's `reward_errors`."""
import pytest

from tests.integration.lifecycle import ROOT, error_lines, steps
from tests.integration.test_your_data import launch

pytest.importorskip("torch")

SLOW = '''
import time

calls = 0


def score(completion, row, ids):
    """The third call of each worker process sleeps 20 s; the rest score at once."""
    global calls
    calls += 1
    if calls == 3:
        time.sleep(20)
    return float(completion == row["answer"])
'''
ARGS = ["run.total_steps=4", "run.checkpoint_every=4", "run.progress=false",
        "task.reward=slow_reward.py:score", "task.reward_timeout_s=1",
        "inference.heartbeat_timeout_s=5", "eval.every_steps=0"]


@pytest.mark.parametrize("on_error", ["fail", "zero"])
def test_a_slow_reward_with_inline_scoring_is_bounded_by_its_timeout(tmp_path, on_error):
    (tmp_path / "slow_reward.py").write_text(SLOW)
    run_dir = tmp_path / "run"
    out = launch("--config", str(ROOT / "configs/default.yaml"), f"run.dir={run_dir}", *ARGS,
                 f"task.reward_on_error={on_error}", cwd=tmp_path)
    if on_error == "fail":
        assert out.returncode == 2, out.stderr[-3000:]
        (line,) = [x for x in error_lines(out.stderr) if "reward" in x]
        assert "'slow_reward.py:score' ran longer than task.reward_timeout_s=1 for row" in line, line
        return
    assert out.returncode == 0, out.stderr[-3000:]
    lines = steps(run_dir)
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert sum(r["reward_errors"] for r in lines) == 1
    assert "worker restarts 0;" in (run_dir / "logs" / "supervisor.log").read_text()
