"""Rewards: the built-in set, resolving `task.reward`, and the inference worker's reward pool
(threads off the decode loop; a reward that raises, times out or returns a non-finite value is
bad environment output naming the function and the row, or scores 0 and is counted)."""
import logging
import queue
import threading
import time

import numpy as np
import pytest

from orchestrator.config import TaskConfig
from orchestrator.data.reward_pool import MAX_STUCK_PER_WORKER, REWARD_ERRORS, BadEnvOutput, RewardPool
from orchestrator.data.rewards import answers_equal, extract_answer, resolve_reward
from orchestrator.data.tokens import DataError, load_tokens
from shm.codec import Sequences

TOKENS = load_tokens(None)


def _task(**kw):
    return TaskConfig(name="dataset", dataset="unused.jsonl", **{"reward": "exact_match", **kw})


@pytest.mark.parametrize("text, ref, ok", [
    ("so 3+4 is 7 #### 7", "#### 7", True),
    ("The total is \\boxed{1,234}.", "Natalia sold 1234 clips.\n#### 1234", True),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("we get $18.00 in the end", "#### 18", True),
    ("the answer is 17", "#### 18", False),
    ("no number at all", "#### 3", False),
    ("\\boxed{x+1}", "\\boxed{ x+1 }", True),
])
def test_math_answer(text, ref, ok):
    _, fn = resolve_reward(_task(reward="math_answer"), TOKENS)
    assert fn(text, {"answer": ref}, []) == float(ok)


def test_answer_normalisation():
    assert extract_answer("a \\boxed{\\text{{b}}} c", loose=True) == "\\text{{b}}"
    assert answers_equal("72.", "72") and answers_equal("-3", "-3.0") and not answers_equal("3", "4")


def test_exact_match_strips_whitespace():
    _, fn = resolve_reward(_task(answer_field="label"), TOKENS)
    assert fn(" Paris\n", {"label": "Paris"}, []) == 1.0 and fn("paris", {"label": "Paris"}, []) == 0.0


def test_user_functions_from_a_file_and_a_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def score(completion, row, ids):\n    return float(len(ids))\n")
    monkeypatch.chdir(tmp_path)
    name, fn = resolve_reward(_task(reward="my_rewards.py:score"), TOKENS)
    assert name == "my_rewards.py:score" and fn("x", {}, [1, 2, 3]) == 3.0
    monkeypatch.syspath_prepend(str(tmp_path))
    _, fn = resolve_reward(_task(reward="my_rewards:score"), TOKENS)
    assert fn("x", {}, [1]) == 1.0


@pytest.mark.parametrize("spec, needle", [
    ("nope.py:score", "no such file"), ("my_rewards.py:missing", "no function"),
    ("no_such_module_xyz:fn", "cannot import"), ("my_rewards.py:CONST", "not callable"),
    ("not a spec", "not a built-in"), ("broken.py:f", "importing"),
])
def test_unresolvable_rewards_name_the_field(tmp_path, monkeypatch, spec, needle):
    (tmp_path / "my_rewards.py").write_text("CONST = 3\ndef score(c, r, i):\n    return 1.0\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as info:
        resolve_reward(_task(reward=spec), TOKENS)
    assert "task.reward" in str(info.value) and needle in str(info.value)


# ------------------------------------------------------------------------------ the reward pool

def _group(pid=7, n=2):
    return Sequences.build(0, 1, 0, [{"prompt": [1, 3], "completion": [4, 5, 2], "prompt_id": pid}] * n)


def _pool(fn, on_error="fail", timeout_s=30.0, workers=2):
    rows = lambda is_eval, row: {"row": row, "eval": is_eval}      # noqa: E731
    return RewardPool(fn, "my_fn", TOKENS, rows, workers, timeout_s, on_error)


def _drain(pool, deadline_s=20.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        out = pool.ready()
        if out:
            return out
        time.sleep(0.005)
    raise AssertionError("the pool never returned the group")


def test_pool_calls_with_text_row_and_ids():
    seen = []

    def fn(completion, row, ids):
        seen.append((completion, row, ids))
        return np.float32(0.5)
    pool = _pool(fn)
    pool.submit(_group(), row=11, is_eval=True)
    (g,) = _drain(pool)
    pool.close()
    assert g.rewards.tolist() == [0.5, 0.5] and g.scalars[REWARD_ERRORS] == 0
    assert seen[0] == ("12", {"row": 11, "eval": True}, [4, 5, 2])   # eos dropped from the text


def test_a_slow_reward_does_not_block_the_caller():
    release = threading.Event()
    pool = _pool(lambda c, r, i: 1.0 if release.wait(30) else 0.0)
    pool.submit(_group(), row=0, is_eval=False)
    assert pool.ready() == [] and pool.busy()       # returns at once while the reward runs
    release.set()
    (g,) = _drain(pool)
    pool.close()
    assert g.rewards.tolist() == [1.0, 1.0] and not pool.busy()


@pytest.mark.parametrize("value, needle", [
    (float("nan"), "nan"), (np.float32("inf"), "inf"), (True, "True"), ("1", "'1'"),
    (None, "None"), (KeyError("answer"), "raised KeyError"),
])
def test_bad_rewards_fail_naming_function_row_and_prompt(value, needle):
    def fn(c, r, i):
        if isinstance(value, Exception):
            raise value
        return value
    pool = _pool(fn)
    pool.submit(_group(pid=7), row=42, is_eval=False)
    with pytest.raises(BadEnvOutput) as info:
        _drain(pool)
    pool.close()
    msg = str(info.value)
    assert "'my_fn'" in msg and "row 42" in msg and "prompt 7" in msg and needle in msg
    assert "\n" not in msg


def test_tolerated_errors_score_zero_and_are_counted():
    calls = []

    def fn(c, r, i):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("first one breaks")
        return 1.0
    pool = _pool(fn, on_error="zero", workers=1)
    pool.submit(_group(), row=0, is_eval=False)
    (g,) = _drain(pool)
    pool.close()
    assert sorted(g.rewards.tolist()) == [0.0, 1.0] and g.scalars[REWARD_ERRORS] == 1


@pytest.mark.parametrize("on_error", ["fail", "zero"])
def test_a_reward_past_its_timeout(on_error):
    never = threading.Event()

    def fn(c, r, i):
        never.wait(60)
        return 1.0
    pool = _pool(fn, on_error=on_error, timeout_s=0.2, workers=1)
    pool.submit(_group(n=1), row=3, is_eval=False)
    if on_error == "fail":
        with pytest.raises(BadEnvOutput, match=r"'my_fn' ran longer than task.reward_timeout_s=0.2 for row 3"):
            _drain(pool)
    else:
        (g,) = _drain(pool)
        assert g.rewards.tolist() == [0.0] and g.scalars[REWARD_ERRORS] == 1
        pool.submit(_group(n=1), row=4, is_eval=False)      # a fresh thread serves the next one
        never.set()
        (g,) = _drain(pool)
        assert g.rewards.tolist() == [1.0]
    never.set()
    pool.close()


def test_inline_pool_scores_each_group_before_submit_returns_in_submit_order():
    threads = []

    def fn(c, r, i):
        threads.append(threading.get_ident())
        return float(r["row"])
    pool = _pool(fn, workers=0)
    for row in (3, 1, 2):
        pool.submit(_group(pid=row), row=row, is_eval=False)
        assert pool.busy()                  # scored, waiting for ready()
    out = pool.ready()                      # already scored: no wait
    pool.close()
    assert [g.rewards.tolist() for g in out] == [[3.0, 3.0], [1.0, 1.0], [2.0, 2.0]]
    assert len(set(threads)) == 1 and not pool.busy()     # one reward thread, in order


def test_inline_pool_judges_a_slow_call_after_the_fact():
    def fn(c, r, i):
        time.sleep(0.1)                     # at least 0.1 s: past the 0.01 s limit, always
        return 1.0
    pool = _pool(fn, on_error="zero", timeout_s=0.01, workers=0)
    pool.submit(_group(n=1), row=5, is_eval=False)
    (g,) = pool.ready()
    pool.close()
    assert g.rewards.tolist() == [0.0] and g.scalars[REWARD_ERRORS] == 1


@pytest.mark.parametrize("on_error", ["fail", "zero"])
def test_inline_pool_abandons_a_call_past_its_timeout_and_keeps_beating(on_error):
    """#38: with workers=0 a reward call that does not return held the worker's main thread (no
    heartbeat; the worker was killed, exit 1 naming nothing). Now submit() returns while the call
    still runs, naming the function and the row, and beats while it waits."""
    release, returned, beats = threading.Event(), [], []

    def fn(c, r, i):
        if r["row"] == 9:
            release.wait(20)
            returned.append(r["row"])
        return 1.0
    pool = _pool(fn, on_error=on_error, timeout_s=0.3, workers=0)
    pool.beat = lambda: beats.append(1)
    if on_error == "fail":
        with pytest.raises(BadEnvOutput, match=r"'my_fn' ran longer than task.reward_timeout_s=0.3 "
                                               r"for row 9 \(prompt 4\)"):
            pool.submit(_group(pid=4, n=2), row=9, is_eval=False)
    else:
        pool.submit(_group(pid=4, n=2), row=9, is_eval=False)
        pool.submit(_group(pid=5, n=1), row=1, is_eval=False)    # a fresh thread serves it
        a, b = pool.ready()
        assert a.scalars[REWARD_ERRORS] == 2 and a.rewards.tolist() == [0.0, 0.0]
        assert b.rewards.tolist() == [1.0] and b.scalars[REWARD_ERRORS] == 0
    assert returned == [] and len(beats) >= 2      # the call still runs; the wait kept beating
    release.set()
    pool.close()


def _threads_since(before):
    """Live reward threads created since `before` (a set of threads): what this test's pool made."""
    return [t for t in threading.enumerate() if t not in before and t.name.startswith("reward")]


def _settle(before, n, deadline_s=30.0):
    end = time.monotonic() + deadline_s
    while len(_threads_since(before)) != n and time.monotonic() < end:
        time.sleep(0.01)
    return len(_threads_since(before))


def test_timed_out_calls_leave_no_thread_behind(caplog):
    """Every call blocks on its own Event until the pool has timed it out; then the test lets it
    return. A replaced thread exits when its stuck call returns (it used to go back to serving: 100
    timeouts, 101 live threads); timeouts are reported in the worker log with counts."""
    before, gates, workers = set(threading.enumerate()), queue.SimpleQueue(), 2

    def fn(c, r, i):
        gate = threading.Event()
        gates.put(gate)
        return 1.0 if gate.wait(60) else 0.5
    pool = _pool(fn, on_error="zero", timeout_s=0.05, workers=workers)
    peak = 0
    with caplog.at_level(logging.WARNING, logger="orchestrator.data.reward_pool"):
        for k in range(80):
            pool.submit(_group(n=1), row=k, is_eval=False)
            (g,) = _drain(pool)
            assert g.rewards.tolist() == [0.0] and g.scalars[REWARD_ERRORS] == 1
            gates.get(timeout=30).set()             # the stuck call returns now
            peak = max(peak, len(_threads_since(before)))
    assert peak <= workers + MAX_STUCK_PER_WORKER * workers
    assert _settle(before, workers) == workers      # the serving threads, no more
    warned = [r.getMessage() for r in caplog.records if "timed out" in r.getMessage()]
    assert warned and "'my_fn' timed out 64 times" in warned[-1] and "reward_timeout_s=0.05" in warned[-1]
    pool.submit(_group(n=2), row=99, is_eval=False)     # the pool still serves, at full speed
    threading.Thread(target=lambda: [gates.get(timeout=30).set() for _ in range(2)], daemon=True).start()
    (g,) = _drain(pool)
    assert g.rewards.tolist() == [1.0, 1.0] and g.scalars[REWARD_ERRORS] == 0
    pool.close()
    assert _settle(before, 0) == 0                  # close() ends every thread it made


def test_a_reward_that_never_returns_fails_the_run_past_the_stuck_cap():
    """Timed-out calls that never return hold their threads; past MAX_STUCK_PER_WORKER x workers of
    them the run fails naming the function, however the errors are tolerated."""
    before, never, workers = set(threading.enumerate()), threading.Event(), 1

    def fn(c, r, i):
        never.wait(60)
        return 1.0
    pool = _pool(fn, on_error="zero", timeout_s=0.05, workers=workers)
    cap = MAX_STUCK_PER_WORKER * workers
    try:
        for k in range(cap):
            pool.submit(_group(n=1), row=k, is_eval=False)
            assert _drain(pool)[0].scalars[REWARD_ERRORS] == 1
            assert len(_threads_since(before)) <= workers + cap
        pool.submit(_group(n=1), row=cap, is_eval=False)
        with pytest.raises(BadEnvOutput, match=rf"'my_fn' left more than {cap} calls running past "
                                               rf"task.reward_timeout_s=0.05 \({cap + 1} timeouts"):
            _drain(pool)
        assert len(_threads_since(before)) <= workers + cap + 1
    finally:
        never.set()
        pool.close()
    assert _settle(before, 0) == 0
