"""kill -9 of the supervisor while agent episodes (`task.agent`, an `openai` client agent over the
worker's endpoint) are in flight, then resume (scripts/kill_resume.py): in steady state, at
checkpoints and during recovery; every step exactly once, every prompt trained exactly once, the
bound kept on resume, nothing left in /dev/shm, and episodes in flight at a kill redone whole."""
import pytest

from tests.integration.lifecycle import assert_episodes_redone, soak

pytest.importorskip("torch")
pytest.importorskip("openai")
pytest.importorskip("aiohttp")

AGENT = '''
import os, random, time
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")   # openai's models built at import: their
from openai import OpenAI                                 # deferred build is not thread-safe


def run(row, base_url, api_key):
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=msgs)
    text = first.choices[0].message.content
    if not text.startswith("|"):
        return 0.0
    time.sleep(random.lognormvariate(-2.8, 1.0))       # a tool of ~0.1 s: episodes outlast a step
    msgs += [first.choices[0].message, {"role": "tool", "content": "=" + row["answer"] + ">"}]
    answer = client.chat.completions.create(model="policy", messages=msgs).choices[0].message.content
    return 0.2 + 0.8 * sum(a == b for a, b in zip(answer[:2], row["answer"])) / 2
'''


@pytest.mark.slow            # a soak
def test_kill_resume_agent_episodes_exactly_once(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    out, result = soak(tmp_path, "--kills", "3", "--seed", "3", "--phases",
                       "steady,checkpoint,recovery", "--hang-timeout", "60", "--timeout", "120",
                       "run.total_steps=24", "run.checkpoint_every=4", "eval.every_steps=0",
                       "rollout.group_size=4", "rollout.max_concurrent_rollouts=8",
                       "rollout.consumer_batch_size=4", f"task.agent={tmp_path / 'agent.py'}:run",
                       config="configs/multiturn.yaml", timeout=600)
    assert_episodes_redone(out, result, tmp_path / "run")
