"""A `verifiers` environment runs unchanged (orchestrator/envs/verifiers_env.py; needs the
`verifiers` extra, skipped without it):
- driven directly with scripted model turns, a vf.ToolEnv calls its python tool (on the runner's
  pool, the event loop running meanwhile), the tool's reply comes back as the next messages, the
  answer ends the episode and the environment's rubric scores it; an environment that rewrites the
  conversation is a clear error; an episode ended early cancels the rollout; a bad spec is a
  DataError;
- end to end, `task.env=verifiers` trains a tiny model (the built-in one; an HF one with a chat
  template) on a vf.ToolEnv: every turn is a tool call (a tool parser for the tiny models'
  vocabularies), so trajectories hold masked tool replies between the model's turns, and the step
  lines carry the episode fields."""
import asyncio
import concurrent.futures as cf
import json

import pytest

from tests.integration.lifecycle import steps
from tests.integration.test_multiturn import _launch, _runs

pytest.importorskip("verifiers")
pytest.importorskip("torch")

from orchestrator.data.tokens import DataError               # noqa: E402
from orchestrator.envs.base import ModelTurn                 # noqa: E402
from orchestrator.envs.verifiers_env import (                # noqa: E402
    ConversationRewritten, VerifiersEnv, _hermes)

VF_ENV = '''
import json
import threading
import time

import verifiers as vf
from datasets import Dataset

TABLE = {"47": "83", "12": "05", "30": "71"}


class RewritingToolEnv(vf.ToolEnv):
    """Drops the model's first turn and its reply from later prompts (as context truncation does)."""

    async def get_prompt_messages(self, state):
        messages = await super().get_prompt_messages(state)
        return messages if len(messages) <= 3 else [messages[0], *messages[3:]]


def load_environment(log: str = "", delay: float = 0.0, max_turns: int = 3, rewrite: bool = False):
    def lookup(key: str) -> str:
        """Look a key up in the table.

        Args:
            key: the two-digit key named by the prompt.
        """
        time.sleep(delay)                        # a blocking tool
        with open(log, "a") as f:
            f.write(json.dumps({"key": key, "thread": threading.current_thread().name}) + "\\n")
        return "=" + TABLE.get(key, "--") + ">"

    def correct(completion, answer) -> float:
        said = [m for m in completion if m["role"] == "assistant"]
        return float(bool(said) and (said[-1].get("content") or "").strip() == answer)

    def called(completion) -> float:
        return float(any(m["role"] == "tool" for m in completion))

    rubric = vf.Rubric(funcs=[correct, called], weights=[0.9, 0.1])
    dataset = Dataset.from_list([{"question": k + ">", "answer": v} for k, v in TABLE.items()])
    env_cls = RewritingToolEnv if rewrite else vf.ToolEnv
    return env_cls(dataset=dataset, tools=[lookup], rubric=rubric, max_turns=max_turns)


def bad_parser(text):
    return text


def tiny_calls(text):
    """The tiny model's tool-call format: every turn looks up its first two characters."""
    return "", [{"name": "lookup", "arguments": {"key": text[:2]}}]
'''

CALL_47 = '<tool_call>{"name": "lookup", "arguments": {"key": "47"}}</tool_call>'


@pytest.fixture
def vf_file(tmp_path):
    path = tmp_path / "vf_lookup.py"
    path.write_text(VF_ENV)
    return path


def _env(vf_file, tmp_path, **kw) -> VerifiersEnv:
    env = VerifiersEnv(env=f"{vf_file}:load_environment", log=str(tmp_path / "tools.jsonl"), **kw)
    env._pool = cf.ThreadPoolExecutor(2, thread_name_prefix="env-tool")
    return env


def _tool_log(tmp_path) -> list[dict]:
    path = tmp_path / "tools.jsonl"
    return [json.loads(x) for x in open(path)] if path.exists() else []


def test_a_tool_env_calls_its_tool_off_the_loop_and_scores_the_answer(vf_file, tmp_path):
    async def episode():
        env = _env(vf_file, tmp_path, delay=0.3)
        opening = await env.reset({"prompt": "47>", "answer": "83"})
        assert opening == [{"role": "user", "content": "47>"}]
        assert [t["function"]["name"] for t in env.tools] == ["lookup"]
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        ticker = asyncio.ensure_future(tick())
        res = await env.step(ModelTurn(f"looking it up {CALL_47}", [1, 2, 3], True))
        ticker.cancel()
        assert not res.done and res.metrics == {"tool_calls": 1.0}
        assert [(m["role"], m["content"]) for m in res.messages] == [("tool", "=83>")]
        assert res.messages[0]["tool_call_id"].startswith("call_")
        assert ticks >= 10                   # the loop ran while the tool slept 0.3 s
        res = await env.step(ModelTurn("83", [4, 5], True))
        assert res.done and res.messages == []
        assert await env.score([]) == pytest.approx(1.0)
        await env.close()
    asyncio.run(episode())
    assert [(r["key"], r["thread"].startswith("env-tool")) for r in _tool_log(tmp_path)] == [("47", True)]


def test_an_answer_without_a_call_ends_the_episode(vf_file, tmp_path):
    async def episode():
        env = _env(vf_file, tmp_path)
        await env.reset({"question": "12>", "answer": "05"})
        res = await env.step(ModelTurn("05", [1, 2], True))
        assert res.done
        assert await env.score([]) == pytest.approx(0.9)          # right, but no tool call
        await env.close()
    asyncio.run(episode())
    assert _tool_log(tmp_path) == []


def test_a_rewritten_conversation_is_a_clear_error(vf_file, tmp_path):
    async def episode():
        env = _env(vf_file, tmp_path, rewrite=True)
        await env.reset({"prompt": "47>", "answer": "83"})
        assert not (await env.step(ModelTurn("a " + CALL_47, [1], True))).done
        with pytest.raises(ConversationRewritten, match="rewrote the conversation at message 1"):
            await env.step(ModelTurn(CALL_47, [1], True))
        await env.close()
    asyncio.run(episode())


def test_an_episode_ended_early_cancels_the_rollout(vf_file, tmp_path):
    async def episode():
        env = _env(vf_file, tmp_path)
        await env.reset({"prompt": "30>", "answer": "71"})
        task = env._task
        await env.close()                    # e.g. task.max_turns or a timeout ended it
        assert task.cancelled()
    asyncio.run(episode())


@pytest.mark.parametrize("args, needle", [
    ({"env": "missing.py:load_environment"}, "no such file"),
    ({"env": ""}, "needs task.env_args.env"),
    ({"tool_parser": "nope"}, "tool_parser='nope'"),
])
def test_a_bad_spec_is_a_data_error(vf_file, tmp_path, args, needle):
    env = VerifiersEnv(**{"env": f"{vf_file}:load_environment", **args})
    with pytest.raises(DataError, match=needle):
        asyncio.run(env.reset({"prompt": "47>"}))


def test_a_parser_that_returns_the_wrong_shape_is_a_clear_error(vf_file, tmp_path):
    async def episode():
        env = _env(vf_file, tmp_path, tool_parser=f"{vf_file}:bad_parser")
        await env.reset({"prompt": "47>", "answer": "83"})
        with pytest.raises(TypeError, match="bad_parser' returned '83', not \\(content, "):
            await env.step(ModelTurn("83", [1], True))
        await env.close()
    asyncio.run(episode())


def test_the_hermes_parser():
    text = f'a {CALL_47} b <tool_call>not json</tool_call> <tool_call>{{"name": "f"}}'
    content, calls = _hermes(text)
    assert calls == [{"name": "lookup", "arguments": {"key": "47"}}, {"name": "f", "arguments": {}}]
    assert content == "a  b <tool_call>not json</tool_call>"


@pytest.mark.parametrize("model", ["builtin", "hf"])
def test_end_to_end_a_tool_env_trains(vf_file, tmp_path, model, request):
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": f"{k:02d}>", "answer": f"{(k * 7) % 100:02d}"}) + "\n"
                     for k in range(24))
    env_args = (f"task.env_args={{env: '{vf_file}:load_environment', tool_parser: '{vf_file}:tiny_calls', "
                f"log: '{tmp_path / 'tools.jsonl'}', max_turns: 2}}")
    extra = ["rollout.max_new_tokens=3"]
    if model == "hf":                # a chat template: the tool schema and the tool turns render through it
        path = request.getfixturevalue("hf_model_dir")
        extra = [f"model.path={path}", "rollout.max_new_tokens=6", "task.max_episode_tokens=100"]
    out = _launch(tmp_path, "run.total_steps=3", f"task.dataset={tmp_path / 'train.jsonl'}",
                  "task.env=verifiers", env_args, *extra)
    assert out.returncode == 0, out.stderr[-3000:]
    from orchestrator.run.durable import read_record
    from shm.codec import decode
    lines = steps(tmp_path / "run")
    assert len(lines) == 3
    replies = 0
    for step, line in enumerate(lines, 1):
        assert line["episodes_limited"] == 0 and line["reward_errors"] == 0
        assert line["tool_calls"] == 4 * 4          # one answered call per episode (vf max_turns=2)
        assert line["env_s_mean"] >= 0 and line["gen_s_mean"] > 0
        b = decode(read_record(str(tmp_path / "run" / "batches" / f"step_{step:08d}.rec")))
        alone = 0
        for i in range(b.n):
            sl = b.seq(i)
            mask, vers = b.loss_mask[sl], b.versions[sl]
            runs = _runs(mask)
            assert (vers[~mask.astype(bool)] == -1).all() and (vers[mask.astype(bool)] >= 0).all()
            if len(runs) == 1:       # the template could not append the reply: rejected, reward 0
                assert model == "hf" and b.rewards[i] == 0
                alone += 1
                continue
            assert len(runs) == 2 and runs[0][1] < runs[1][0]       # turn, masked tool reply, turn
            replies += 1
        assert alone == line["rollouts_rejected"]
        assert line["turns_max"] == 2
    assert replies >= 3 * 16 // 2
    assert len(_tool_log(tmp_path)) >= 3 * 4 * 4      # every trained episode's call ran its tool
