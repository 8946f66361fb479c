"""An agent written with the `openai` client learns the built-in `lookup` task through the worker's
HTTP endpoint as the in-process `lookup` environment does (#26): two runs of the multi-turn job
(configs/multiturn.yaml: the tiny model, async S=2), same seed and same overrides, one with the
in-process environment, one with `task.agent: orchestrator.envs.agent_lookup:run` (AsyncOpenAI,
the same rules and reward over HTTP). Both must gain the same threshold over their first steps, and
their last rewards must be comparable (within a tolerance of each other), with every episode of
the agent run trained (none rejected: every call extended its trajectory).
Observed (seed 0, mean reward of steps 1-10 -> 91-100): in process 0.020 -> 0.442 (45 s of steps),
agent 0.021 -> 0.441 (372 s of steps); a calibration pair whose in-process run had its lr schedule
over 200 steps: 0.02 -> 0.49 vs 0.02 -> 0.37, the same curve over the first 40 steps.
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
         "run.seed=0", "eval.every_steps=0", "run.checkpoint_every=0", "task.env_args={latency_s: 0.0}",
         *overrides], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = steps(run_dir)
    assert [r["step"] for r in lines] == list(range(1, STEPS + 1))
    return lines


@pytest.mark.slow            # 7.5 min on 2 cores: ~1 min in process, ~6.5 min through HTTP
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
