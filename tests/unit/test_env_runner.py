"""The episode runner (real environment thread, real asyncio loop, real pool), driven by a scripted
decode loop in place of the backend: trajectories are appended exactly (sampled ids verbatim with
their versions and logprobs, replies masked out), limits end episodes with reward 0 and a counted
reason, a raising environment fails naming it and the row or is counted, sync environments run on
the pool, every episode's environment is closed once, cancel stops a group; a rejected episode is not trained
(mask 0); a hung blocking call is abandoned and its pool thread replaced, a blocked loop is reported
naming the call; a huge reply ends the episode without being tokenized (nor on the loop)."""
import asyncio
import os
import threading
import time

import numpy as np
import pytest

from orchestrator.data.reward_pool import REWARD_ERRORS, BadEnvOutput
from orchestrator.data.tokens import load_tokens
from orchestrator.config import TaskConfig
from orchestrator.envs.base import (LIMITED, REJECTED, TOOL_CALLS, TURNS, TURNS_MAX, Environment,
                                    StepResult)
from orchestrator.envs.render import TurnRenderer
from orchestrator.envs.runner import EpisodeRunner, Limits
from shm.codec import Sequences

pytest.importorskip("transformers")
TOKENS = load_tokens(None)
TOK = TOKENS.tokenizer
EOS = TOKENS.eos_id
CLOSED = []


def ids(text):
    return list(TOK(text, add_special_tokens=False)["input_ids"])


class Echo(Environment):
    """Replies '=<turn number>>' until `turns` turns, then done; reward = turns seen / 10."""

    def __init__(self, turns: int = 2, fail: str = "", sleep_s: float = 0.0, reply: str = "=1>"):
        self.turns, self.fail, self.sleep_s, self.reply, self.seen = turns, fail, sleep_s, reply, []

    async def reset(self, row):
        if self.fail == "reset":
            raise KeyError("no such column")
        return [{"role": "user", "content": row["prompt"]}]

    async def step(self, turn):
        if self.fail == "step":
            raise ValueError("tool exploded\nsecond line")
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        self.seen.append(turn)
        done = len(self.seen) >= self.turns
        return StepResult([] if done else [{"role": "tool", "content": self.reply}], done,
                          {"tool_calls": 0.0 if done else 1.0})

    async def score(self, transcript):
        return float("nan") if self.fail == "score" else len(self.seen) / 10

    def close(self):
        CLOSED.append(self)


class SyncEcho:
    """Plain functions, no base class: run on the pool, not on the loop's thread."""
    threads = set()

    def __init__(self):
        self.n = 0

    def reset(self, row):
        SyncEcho.threads.add(threading.get_ident())
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, turn):
        SyncEcho.threads.add(threading.get_ident())
        self.n += 1
        return StepResult([{"role": "tool", "content": "=2>"}], self.n >= 2)

    def score(self, transcript):
        return 1.0


def runner(cls=Echo, max_turns=4, max_new=3, budget=60, timeout_s=10.0, on_error="fail", **args):
    rows = lambda is_eval, row: {"prompt": f"{row:02d}>"}       # noqa: E731
    lim = Limits(max_turns, max_new, budget, timeout_s, on_error, workers=2)
    return EpisodeRunner(cls, args, TurnRenderer(TOKENS, TaskConfig()), TOKENS, rows, lim, "echo", seed=0)


def drive(r, sample=lambda i: ids("12") + [EOS], version=lambda: 0, deadline_s=20.0):
    """The decode loop's part: answer each turn request with `sample(k)` (k-th turn overall)."""
    turns, out, end = [], [], time.monotonic() + deadline_s
    while not out and time.monotonic() < end:
        for t in r.requests():
            got = sample(len(turns))[:t.max_new_tokens]
            v = version()
            turns.append((t, got, v))
            seqs = Sequences.build(0, t.key, v, [{"prompt": list(t.ids), "completion": got,
                                                  "logprobs": [-0.25] * len(got), "versions": v}])
            r.turn_done(t.key, seqs)
        out = r.ready()
        time.sleep(0.001)
    assert out, "no group finished"
    return out, turns


def test_trajectory_is_appended_exactly():
    r = runner(turns=3)
    r.start(7, prompt_id=5, row=4, n=2, is_eval=False, temperature=1.0)
    versions = iter(range(100))
    (g,), turns = drive(r, sample=lambda k: ids(f"{k:02d}") + [EOS],      # every turn unique
                        version=lambda: next(versions) // 2)              # weights move between turns
    r.close()
    assert g.n == 2 and g.ident == 7 and list(g.prompt_ids) == [5, 5] and g.kind == 0
    assert g.rewards.tolist() == pytest.approx([0.3, 0.3])
    assert len(turns) == 6
    for i in range(2):
        sl = g.seq(i)
        tokens, mask, vers = g.tokens[sl].tolist(), g.loss_mask[sl].tolist(), g.versions[sl].tolist()
        assert g.prompt_lens[i] == 4
        expect, expect_mask, expect_ver = list(TOK("04>")["input_ids"]), [0] * 4, [-1] * 4
        for k in range(3):          # each turn's prompt is exactly the ids so far; its ids follow
            (s, v), = [(s, v) for t, s, v in turns
                       if list(t.ids) == expect and tokens[len(expect):len(expect) + len(s)] == s]
            expect += s
            expect_mask += [1] * len(s)
            expect_ver += [v] * len(s)
            if k < 2:
                expect += ids("=1>")
                expect_mask += [0] * 3
                expect_ver += [-1] * 3
        assert (tokens, mask, vers) == (expect, expect_mask, expect_ver)
        lp = g.logprobs[sl]
        assert (lp[np.array(mask, bool)] == -0.25).all() and (lp[~np.array(mask, bool)] == 0).all()
    assert g.version == min(v for _, _, v in turns)
    assert g.scalars[TURNS] == 6 and g.scalars[TURNS_MAX] == 3 and g.scalars[TOOL_CALLS] == 4


@pytest.mark.parametrize("kw, reason", [
    (dict(turns=9, max_turns=2), "turns"), (dict(turns=9, budget=14), "tokens"),
    (dict(turns=2, sleep_s=5.0, timeout_s=0.2), "timeout"),
])
def test_limits_end_episodes_with_zero_reward_and_a_count(kw, reason):
    r = runner(**kw)
    r.start(1, prompt_id=0, row=0, n=3, is_eval=True, temperature=1.0)
    (g,), _ = drive(r)
    r.close()
    assert g.rewards.tolist() == [0, 0, 0] and g.scalars[LIMITED] == 3 and g.kind == 1
    assert all(g.seq(i).stop - g.seq(i).start <= kw.get("budget", 60) for i in range(3))


def test_a_reply_that_cannot_be_appended_is_rejected_and_counted(hf_model_dir):
    tokens = load_tokens(str(hf_model_dir))
    tokens.tokenizer.chat_template = (      # drops every earlier assistant turn's text
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    rows = lambda is_eval, row: {"prompt": "hi"}                # noqa: E731
    r = EpisodeRunner(Echo, {"turns": 3}, TurnRenderer(tokens, TaskConfig()), tokens, rows,
                      Limits(4, 3, 60, 10.0, "fail", 2), "echo", seed=0)
    r.start(1, prompt_id=0, row=0, n=2, is_eval=False, temperature=1.0)
    stop = tokens.stop_ids[0]
    (g,), _ = drive(r, sample=lambda k: list(tokens.tokenizer("ab", add_special_tokens=False)["input_ids"]) + [stop])
    r.close()
    assert g.rewards.tolist() == [0, 0] and g.scalars[REJECTED] == 2
    assert not g.loss_mask.any()         # not trained: the turns it sampled are masked out too


@pytest.mark.parametrize("fail, needle", [("reset", "reset() raised KeyError"),
                                          ("step", "step() raised ValueError: tool exploded"),
                                          ("score", "score() returned nan")])
def test_a_raising_environment_fails_naming_it_and_the_row(fail, needle):
    r = runner(fail=fail)
    r.start(3, prompt_id=9, row=12, n=2, is_eval=False, temperature=1.0)
    with pytest.raises(BadEnvOutput) as info:
        drive(r)
    r.close()
    msg = str(info.value)
    assert "environment 'echo'" in msg and "row 12 (prompt 9)" in msg and needle in msg
    assert "\n" not in msg


def test_tolerated_errors_score_zero_and_are_counted():
    r = runner(fail="step", on_error="zero")
    r.start(3, prompt_id=9, row=12, n=4, is_eval=False, temperature=1.0)
    (g,), _ = drive(r)
    r.close()
    assert g.rewards.tolist() == [0] * 4 and g.scalars[REWARD_ERRORS] == 4


def test_sync_environments_run_on_the_pool_and_envs_close_once():
    SyncEcho.threads.clear()
    r = runner(cls=SyncEcho)
    r.start(1, prompt_id=0, row=1, n=3, is_eval=False, temperature=1.0)
    (g,), _ = drive(r)
    assert g.rewards.tolist() == [1, 1, 1]
    assert SyncEcho.threads and r._thread.ident not in SyncEcho.threads
    r.close()
    CLOSED.clear()
    r = runner(turns=2)
    r.start(1, prompt_id=0, row=1, n=5, is_eval=False, temperature=1.0)
    drive(r)
    r.close()
    assert len(CLOSED) == 5 and len({id(e) for e in CLOSED}) == 5


def test_cancel_stops_a_group_and_returns_its_turns():
    CLOSED.clear()
    r = runner(turns=2)
    r.start(1, prompt_id=0, row=1, n=3, is_eval=False, temperature=1.0)
    end = time.monotonic() + 10
    pending = []
    while len(pending) < 3 and time.monotonic() < end:
        pending += r.requests()
        time.sleep(0.001)
    keys = r.cancel(1)
    assert sorted(keys) == sorted(t.key for t in pending) and not r.busy()
    for t in pending:          # late results of cancelled turns are ignored
        r.turn_done(t.key, Sequences.build(0, t.key, 0, [{"prompt": list(t.ids), "completion": [EOS],
                                                          "logprobs": [-1.0], "versions": 0}]))
    end = time.monotonic() + 10
    while len(CLOSED) < 3 and time.monotonic() < end:
        time.sleep(0.005)
    assert r.ready() == [] and len(CLOSED) == 3
    r.close()


class ToolPid(Environment):
    """One turn whose tool reports the process it ran in."""

    async def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    async def step(self, turn):
        self.pid = await self.run_tool(os.getpid)
        return StepResult(done=True)

    async def score(self, transcript):
        return float(self.pid)


@pytest.mark.parametrize("processes", [False, True])
def test_tools_run_on_the_pool_threads_or_processes(processes):
    rows = lambda is_eval, row: {"prompt": "01>"}               # noqa: E731
    lim = Limits(2, 3, 60, 30.0, "fail", workers=2, processes=processes)
    r = EpisodeRunner(ToolPid, {}, TurnRenderer(TOKENS, TaskConfig()), TOKENS, rows, lim, "pid", seed=0)
    r.start(1, prompt_id=0, row=0, n=2, is_eval=False, temperature=1.0)
    (g,), _ = drive(r, deadline_s=60)
    r.close()
    pids = set(g.rewards.astype(int).tolist())
    assert (os.getpid() in pids) != processes and len(pids) >= 1


def test_bad_env_args_fail_naming_the_environment():
    r = runner(no_such_arg=1)
    r.start(3, prompt_id=9, row=12, n=2, is_eval=False, temperature=1.0)
    with pytest.raises(BadEnvOutput, match=r"environment 'echo' for row 12 \(prompt 9\): constructing it "
                                           r"with task.env_args raised TypeError"):
        drive(r)
    r.close()


class SyncHang:
    """Plain methods, one turn, reward 1; step() on row `hang_row` blocks until `release` is set
    (a tool that never answers)."""
    release = threading.Event()

    def __init__(self, hang_row: int = -1):
        self.hang_row, self.row = hang_row, None

    def reset(self, row):
        self.row = row["prompt"]
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, turn):
        if self.row == f"{self.hang_row:02d}>":
            SyncHang.release.wait()
        return StepResult(done=True)

    def score(self, transcript):
        return 1.0


def test_a_stuck_sync_call_leaves_the_pool_to_healthy_episodes():
    """One pool thread: the hung step() of row 5 is abandoned at its timeout and its thread replaced,
    so the episodes after it (same worker, same pool) still get their real reward; the stuck call is
    reported naming the environment and the row, and pool threads never hold up the exit."""
    SyncHang.release.clear()
    rows = lambda is_eval, row: {"prompt": f"{row:02d}>"}       # noqa: E731
    lim = Limits(2, 3, 60, 1.0, "fail", workers=1)
    r = EpisodeRunner(SyncHang, {"hang_row": 5}, TurnRenderer(TOKENS, TaskConfig()), TOKENS, rows, lim,
                      "hang.py:SyncHang", seed=0)
    try:
        r.start(1, prompt_id=0, row=5, n=1, is_eval=False, temperature=1.0)
        (g,), _ = drive(r)
        assert g.rewards.tolist() == [0] and g.scalars[LIMITED] == 1          # the hung one: limited
        for rid in (2, 3):                 # later groups on the same one-thread pool
            r.start(rid, prompt_id=rid, row=rid, n=3, is_eval=False, temperature=1.0)
            (g,), _ = drive(r)
            assert g.rewards.tolist() == [1, 1, 1] and g.scalars[LIMITED] == 0
        why = r.hung(max_stuck=0)
        assert why is not None and "environment 'hang.py:SyncHang'" in why and "1 blocking calls" in why
        assert "step() of environment 'hang.py:SyncHang' for row 5 (prompt 0)" in why and "\n" not in why
        assert r.hung(max_stuck=1) is None
        pool = [t for t in threading.enumerate() if t.name.startswith("env-")]
        assert pool and all(t.daemon for t in pool)
    finally:
        r.close()
        SyncHang.release.set()


class BlockingStep(Echo):
    """An async step() that blocks its thread instead of awaiting (here until `release`)."""
    release = threading.Event()

    async def step(self, turn):
        BlockingStep.release.wait(60)          # a time.sleep in an async method, but releasable
        return await super().step(turn)


def test_an_async_method_that_blocks_the_loop_is_reported_naming_it():
    """The loop's own stamp stops: hung() names the call, the row and the blocking line; close()
    does not wait on the stalled loop."""
    BlockingStep.release.clear()
    r = runner(cls=BlockingStep, timeout_s=0.5)
    try:
        assert r.hung(0) is None
        r.start(4, prompt_id=8, row=3, n=2, is_eval=False, temperature=1.0)
        end, why = time.monotonic() + 30, None
        while why is None and time.monotonic() < end:
            for t in r.requests():
                r.turn_done(t.key, Sequences.build(0, t.key, 0, [{"prompt": list(t.ids), "completion": [EOS],
                                                                  "logprobs": [-1.0], "versions": 0}]))
            why = r.hung(max_stuck=99)
            time.sleep(0.01)
        assert why is not None, "a blocked loop was never reported"
        assert why.startswith("step() of environment 'echo' for row 3 (prompt 8) at test_env_runner.py:")
        assert "blocked the environment loop" in why and "(step)" in why
        r.close()
        assert r._thread.is_alive()            # not waited for: it is stuck in the environment
    finally:
        BlockingStep.release.set()
    r._thread.join(30)                         # once the call returns, the loop shuts down by itself
    assert not r._thread.is_alive()


class HugeReply(Echo):
    """Replies with `chars` characters."""

    def __init__(self, chars: int):
        super().__init__(turns=9, reply="=" * chars)


class CountingTokenizer:
    """The real tokenizer, recording the length of every text it encodes and the thread encoding it."""

    def __init__(self, tok):
        self._tok, self.seen = tok, []

    def __call__(self, text, **kw):
        self.seen.append((len(text), threading.get_ident()))
        return self._tok(text, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_a_huge_reply_ends_limited_without_being_tokenized_on_the_loop():
    """A 2M-character reply to an episode with 60 tokens in all: the episode ends limited, the
    tokenizer never sees more than the budget's worth of characters, and never on the loop thread."""
    counting = CountingTokenizer(TOK)
    tokens = type(TOKENS)(counting, TOKENS.stop_ids, TOKENS.pad_id)
    rows = lambda is_eval, row: {"prompt": f"{row:02d}>"}       # noqa: E731
    r = EpisodeRunner(HugeReply, {"chars": 2_000_000}, TurnRenderer(tokens, TaskConfig()), tokens, rows,
                      Limits(4, 3, 60, 10.0, "fail", 2), "huge", seed=0)
    r.start(1, prompt_id=0, row=4, n=2, is_eval=False, temperature=1.0)
    (g,), turns = drive(r)
    r.close()
    assert g.rewards.tolist() == [0, 0] and g.scalars[LIMITED] == 2 and len(turns) == 2
    assert counting.seen and max(n for n, _ in counting.seen) <= 60 * TurnRenderer(
        TOKENS, TaskConfig()).max_token_chars
    assert r._thread.ident not in {t for _, t in counting.seen}
