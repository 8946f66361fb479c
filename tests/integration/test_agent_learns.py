"""An agent written with the `openai` client learns the built-in `lookup` task through the worker's
HTTP endpoint as the in-process `lookup` environment does (#26): two runs of the multi-turn job
(configs/multiturn.yaml: the tiny model), same seed and same overrides, one with the in-process
environment, one with `task.agent: orchestrator.envs.agent_lookup:run` (AsyncOpenAI, the same rules
and reward over HTTP). Both must gain the same threshold over their first steps, and their last
rewards must be comparable (within a tolerance of each other), with every episode of the agent run
trained (none rejected: every call extended its trajectory).
Both runs are on-policy (rollout.max_head_offpolicyness=0): the HTTP path is ~5x slower, and
asynchronously that changes how stale its batches are, so the two curves then differ by timing
(in CI on 2026-12-04 at S=2: in process 0.02 -> 0.46, agent 0.02 -> 0.26), not by the path. At S=0
both see the same policy per step: observed (seed 0, mean reward of steps 1-10 -> 91-100) in
process 0.020 -> 0.448 (83 s of steps), agent 0.024 -> 0.470 (388 s), curves equal to +-0.1 at
every 10 steps. The async agent path is test_agent_http's and test_agent_kill_resume's subject.
The throughput of the two paths is scripts/bench_pipeline.py --backend agent's, not asserted here."""
import subprocess
import sys

import numpy as np
import pytest

from tests.integration.lifecycle import ROOT, steps

pytest.importorskip("torch")
pytest.importorskip("openai")
pytest.importorskip("aiohttp")

STEPS = 100
GAIN = 0.25          # both runs: mean reward of the last 10 steps minus that of the first 10
CLOSE = 0.2          # |last 10 agent - last 10 in process|


def _run(run_dir, *overrides):
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.launch", "--config", "configs/multiturn.yaml",
         f"run.dir={run_dir}", "run.resume=never", "run.progress=false", f"run.total_steps={STEPS}",
         "run.seed=0", "rollout.max_head_offpolicyness=0", "eval.every_steps=0",
         "run.checkpoint_every=0", "task.env_args={latency_s: 0.0}",
         *overrides], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = steps(run_dir)
    assert [r["step"] for r in lines] == list(range(1, STEPS + 1))
    return lines


@pytest.mark.slow            # 8.5 min on 2 cores: ~1.5 min in process, ~7 min through HTTP
def test_an_openai_agent_learns_lookup_as_the_in_process_environment_does(tmp_path):
    env = _run(tmp_path / "env")
    agent = _run(tmp_path / "agent", "task.agent=orchestrator.envs.agent_lookup:run")
    curves = {}
    for name, lines in (("env", env), ("agent", agent)):
        r = np.array([x["reward_mean"] for x in lines])
        curves[name] = (r[:10].mean(), r[-10:].mean())
        assert curves[name][1] - curves[name][0] >= GAIN, (name, curves)
        assert all(x["rollouts_rejected"] == 0 for x in lines), name
        assert np.mean([x["turns_mean"] for x in lines[-10:]]) >= 1.9, name     # it calls the tool
    assert abs(curves["agent"][1] - curves["env"][1]) <= CLOSE, curves
