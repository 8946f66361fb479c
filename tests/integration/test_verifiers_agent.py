"""verifiers 0.4 (`verifiers.v1`) environments as `task.agent` (orchestrator/envs/verifiers_agent.py):
one real launch of the multi-turn job (`configs/multiturn.yaml`: the tiny model, supervisor,
inference and trainer workers, the worker's endpoint) whose agent file is the two lines a verifiers
user writes, over a verifiers env made here: an in-memory Taskset (4 tasks, each with a `target`)
whose `@reward` is a function of the task data, and an in-process Harness (its chat loop runs in
the worker's process, on the environment loop, through verifiers' interception server: no `uv`, no
download) that plays two turns (the model, a user reply, the model again). The dataset mixes both
row kinds: rows with `idx` (the env's own task at that position) and rows that are the task data.
Checked on that one run:
- it exits 0, 4 step lines, none with a rejected rollout or a reward error;
- every trained sample is, token by token, the last call's prompt + sampled ids that some episode
  got through verifiers' interception (the two turns extend one trajectory), and its reward is the
  verifiers reward of that episode's task: the row's own target, or the taskset's for `idx` rows;
- each step line's reward_mean is the mean of those rewards (never the default 0);
- `python -m orchestrator.audit RUN_DIR` passes.
Skipped unless verifiers >= 0.4 is importable (it lives in .venv-verifiers04 only)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.integration.lifecycle import ROOT, steps

verifiers = pytest.importorskip("verifiers")
if tuple(int(p) for p in verifiers.__version__.split(".")[:2]) < (0, 4):
    pytest.skip(f"verifiers {verifiers.__version__} < 0.4 (no verifiers.v1)", allow_module_level=True)
pytest.importorskip("verifiers.v1")
pytest.importorskip("torch")
pytest.importorskip("aiohttp")

TASKSET = '''
import json
import verifiers.v1 as vf
from openai import AsyncOpenAI


def score(target):
    return 0.1 + 0.2 * (target % 4)


class EchoData(vf.TaskData):
    target: int = 0


class EchoTask(vf.Task[EchoData]):
    @vf.reward
    async def by_target(self, task, trace) -> float:
        return score(task.target)


class EchoTaskset(vf.Taskset[EchoTask]):
    def load(self):
        for i in range(4):
            yield EchoTask(EchoData(prompt=f"{{i}}>", target=10 + i), self.config.task)


class EchoHarness(vf.Harness[vf.HarnessConfig]):
    """The chat loop in this process: two turns through the interception (`endpoint`, `secret`)."""
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kw):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=60)
        try:
            msgs, calls = [{{"role": "user", "content": data.prompt}}], []
            for turn in range(2):
                r = await client.chat.completions.create(model=ctx.model, messages=msgs,
                                                         extra_body={{"return_token_ids": True}})
                c = r.choices[0]
                calls.append(r.prompt_token_ids + c.token_ids)
                msgs += [c.message.model_dump(exclude_none=True), {{"role": "user", "content": "ok"}}]
        finally:
            await client.close()
        with open({log!r}, "a") as f:
            f.write(json.dumps({{"prompt": data.prompt, "target": data.target, "ids": calls[-1],
                                "reward": score(data.target)}}) + "\\n")
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["EchoTaskset", "EchoHarness"]
'''

AGENT = '''
import sys
sys.path.insert(0, {dir!r})
import verifiers.v1 as vf
from orchestrator.envs.verifiers_agent import verifiers_agent

run = verifiers_agent(vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
    taskset={{"id": "vf04_echo"}}, agent={{"runtime": {{"type": "subprocess"}}}})))
'''


def score(target):
    return 0.1 + 0.2 * (target % 4)


def test_a_verifiers_04_env_trains_through_the_endpoint(tmp_path):
    from orchestrator.run.durable import read_record
    from shm.codec import decode

    log = tmp_path / "episodes.jsonl"
    (tmp_path / "vf04_echo.py").write_text(TASKSET.format(log=str(log)))
    (tmp_path / "vf_agent.py").write_text(AGENT.format(dir=str(tmp_path)))
    rows = [{"idx": i, "prompt": f"{i}>"} for i in range(4)] + \
           [{"prompt": f"{t}>", "target": t, "note": "ignored"} for t in (5, 6, 7, 8)]
    with open(tmp_path / "rows.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", "--config", "configs/multiturn.yaml",
         f"run.dir={run_dir}", "run.progress=false", "run.total_steps=4", "run.checkpoint_every=0",
         "eval.every_steps=0", "task.name=dataset", f"task.dataset={tmp_path / 'rows.jsonl'}",
         f"task.agent={tmp_path / 'vf_agent.py'}:run", "rollout.group_size=4",
         "rollout.consumer_batch_size=2", "rollout.max_concurrent_rollouts=8",
         "rollout.max_head_offpolicyness=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]

    recs = [json.loads(line) for line in open(log)]
    expected = {f"{i}>": score(10 + i) for i in range(4)} | {f"{t}>": score(t) for t in (5, 6, 7, 8)}
    assert {r["prompt"] for r in recs} == set(expected)      # 8 groups: one epoch, both row kinds
    for r in recs:                      # the task each row became: the taskset's, or the row itself
        assert r["reward"] == pytest.approx(expected[r["prompt"]]), r
    by_ids = {}
    for r in recs:
        by_ids.setdefault(tuple(r["ids"]), set()).add(r["reward"])

    lines = steps(run_dir)
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    for step, line in enumerate(lines, 1):
        b = decode(read_record(str(run_dir / "batches" / f"step_{step:08d}.rec")))
        assert b.n == 8
        rewards = []
        for i in range(b.n):
            cands = by_ids.get(tuple(b.tokens[b.seq(i)].tolist()))
            assert cands, f"step {step} sample {i}: not the ids an episode got through verifiers"
            assert any(np.isclose(b.rewards[i], c) for c in cands), (b.rewards[i], cands)
            rewards.append(float(b.rewards[i]))
        assert line["reward_mean"] == pytest.approx(np.mean(rewards), abs=1e-6)
        assert line["reward_mean"] > 0
        assert line["rollouts_rejected"] == 0 and line.get("reward_errors", 0) == 0, line

    audit = subprocess.run([sys.executable, "-m", "orchestrator.audit", str(run_dir)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0 and json.loads(audit.stdout)["ok"], audit.stdout + audit.stderr


BROKEN = '''
import verifiers.v1 as vf


class OneData(vf.TaskData):
    target: int = 0


class OneTask(vf.Task[OneData]):
    @vf.reward
    async def r(self, task, trace) -> float:
        return 1.0


class OneTaskset(vf.Taskset[OneTask]):
    def load(self):
        yield OneTask(OneData(prompt="0>", target=3), self.config.task)


class EndlessTaskset(OneTaskset):
    INFINITE = True


class RaisingHarness(vf.Harness[vf.HarnessConfig]):
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kw):
        raise KeyError("the harness broke")


__all__ = [{taskset!r}, "RaisingHarness"]
'''


def test_bad_rows_envs_and_failed_episodes_are_clear_errors(tmp_path, monkeypatch):
    """No launch: the bridge's refusals, each injected for real (a row that is no task, a position
    past the taskset, an infinite taskset, a harness that raises, a remote runtime, not an Env, no
    verifiers), each a one-line error naming the cause; no episode leaves its key variable."""
    import asyncio
    import os

    import verifiers.v1 as vf
    from orchestrator.envs.verifiers_agent import KEY_VAR, verifiers_agent

    for name, taskset in (("vf04_one", "OneTaskset"), ("vf04_endless", "EndlessTaskset")):
        (tmp_path / f"{name}.py").write_text(BROKEN.format(taskset=taskset))
    monkeypatch.syspath_prepend(str(tmp_path))

    def env(taskset_id, runtime="subprocess"):
        return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset={"id": taskset_id},
                                                         agent={"runtime": {"type": runtime}}))

    def fails(run, row):
        with pytest.raises(Exception) as info:
            asyncio.run(run(row, "http://127.0.0.1:9/e/k0/v1", "k0"))
        assert "\n" not in str(info.value)
        return f"{type(info.value).__name__}: {info.value}"

    run = verifiers_agent(env("vf04_one"))
    assert "row idx=5 is not a task of OneTaskset (1 tasks)" in fails(run, {"idx": 5})
    assert "the row is not OneData (prompt" in fails(run, {"prompt": 3})
    assert "the row is not OneData (target" in fails(run, {"prompt": "0>", "target": "x"})
    why = fails(run, {"idx": 0})                      # the taskset's task, played: the harness raises
    assert why.startswith("RuntimeError: the verifiers episode failed (HarnessError") and "the harness broke" in why
    assert "is infinite" in fails(verifiers_agent(env("vf04_endless")), {"idx": 0})
    assert not [k for k in os.environ if k.startswith(KEY_VAR)]

    with pytest.raises(ValueError, match=r"agent seats agent \(prime\) run in a remote runtime"):
        verifiers_agent(env("vf04_one", runtime="prime"))
    with pytest.raises(TypeError, match="a verifiers.v1.Env"):
        verifiers_agent(object())
    monkeypatch.setattr(sys.modules["verifiers"], "__version__", "0.3.9")
    with pytest.raises(RuntimeError, match=r"verifiers 0.3.9 is installed"):
        verifiers_agent(object())
    for mod in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")]:
        monkeypatch.setitem(sys.modules, mod, None)    # an import of verifiers now fails for real
    with pytest.raises(RuntimeError, match=r"needs verifiers >= 0.4 \(pip install"):
        verifiers_agent(object())


def test_the_classic_adapter_on_04_points_to_task_agent_and_downloads_are_said_at_start(tmp_path):
    """#38 item 8, through the launcher's own preflight and a launch: `task.env=verifiers` with
    verifiers 0.4 installed is exit 2 naming the `task.agent` lines that run it; an agent whose seat
    uses verifiers' built-in `bash` harness (it downloads uv and its program at an episode's start)
    is one warning line before the run starts; the in-process harness of the first test is none."""
    from orchestrator.config import load_config
    from orchestrator.data.workload import load_prompts

    (tmp_path / "vf04_one.py").write_text(BROKEN.format(taskset="OneTaskset"))
    with open(tmp_path / "rows.jsonl", "w") as f:
        f.writelines(json.dumps({"idx": 0, "prompt": "0>"}) + "\n" for _ in range(4))
    base = ["run.progress=false", "task.name=dataset", f"task.dataset={tmp_path / 'rows.jsonl'}",
            "eval.every_steps=0"]
    out = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--config",
                          "configs/multiturn.yaml", f"run.dir={tmp_path / 'run'}", *base,
                          "task.env=verifiers", "task.env_args.env=vf04_one:OneTaskset"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = out.stderr.strip().splitlines()
    assert "verifiers 0.4" in line and "task.agent=" in line and "verifiers_agent" in line, line
    assert not (tmp_path / "run").exists()

    for harness, said in (("bash", True), (None, False)):
        seat = {"runtime": {"type": "subprocess"}} | ({"harness": {"id": harness}} if harness else {})
        agent = tmp_path / f"agent_{harness}.py"
        agent.write_text(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
                         "import verifiers.v1 as vf\n"
                         "from orchestrator.envs.verifiers_agent import verifiers_agent\n"
                         "run = verifiers_agent(vf.SingleAgentEnv(vf.SingleAgentEnvConfig(\n"
                         f"    taskset={{'id': 'vf04_one'}}, agent={seat!r})))\n")
        cfg = load_config(ROOT / "configs/multiturn.yaml", [*base, f"task.agent={agent}:run"])
        load_prompts(cfg)                              # what the launcher runs before any worker
        lines = [n for n in cfg.notes if "verifiers_agent" in n]
        if said:
            (note,) = lines
            assert "agent seat agent (bash: BashHarness)" in note and "offline" in note, note
        else:
            assert lines == [], lines
