"""Multi-turn configuration: what `task.env` may be combined with, and the registry's errors (each
names task.env and what is wrong)."""
import re

import pytest

from orchestrator.config import ConfigError, env_spec, load_config
from orchestrator.data.tokens import DataError
from orchestrator.envs.registry import resolve_env
from orchestrator.envs.lookup import LookupEnv


@pytest.mark.parametrize("overrides, needle", [
    (["task.name=lookup", "task.env=x.py:E"], "task.name='lookup' is the lookup environment's task"),
    (["task.name=lookup", "task.reward=exact_match"], "task.reward and task.env are exclusive"),
    (["task.name=dataset", "task.dataset=d.jsonl", "task.env=x.py:E", "task.reward=digits"], "exclusive"),
    (["task.name=dataset", "task.dataset=d.jsonl", "eval.every_steps=0"], "task.dataset needs task.reward"),
    (["task.name=lookup", "task.env_args={a: [1]}"], "task.env_args"),
    (["task.name=lookup", "task.max_turns=0"], "task.max_turns"),
])
def test_bad_combinations_name_the_field(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(None, overrides)


def test_env_spec():
    assert env_spec(load_config(None, ["task.name=lookup"])) == "lookup"
    assert env_spec(load_config(None, ["task.name=dataset", "task.dataset=d.jsonl", "task.env=m:E",
                                       "eval.every_steps=0"])) == "m:E"
    assert env_spec(load_config(None, [])) is None


def test_registry(tmp_path, monkeypatch):
    assert resolve_env("lookup") is LookupEnv
    (tmp_path / "envs_here.py").write_text(
        "class Good:\n    def reset(self, row): ...\n    def step(self, t): ...\n    def score(self, t): ...\n"
        "class NoScore:\n    def reset(self, row): ...\n    def step(self, t): ...\n"
        "not_a_class = 3\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_env("envs_here.py:Good").__name__ == "Good"
    for spec, needle in [("envs_here.py:NoScore", "has no score method"),
                         ("envs_here.py:not_a_class", "is not a class"),
                         ("envs_here.py:Missing", "has no class 'Missing'"),
                         ("nope", "not a built-in (lookup, verifiers)")]:
        with pytest.raises(DataError, match=re.escape(needle)) as info:
            resolve_env(spec)
        assert str(info.value).startswith(f"task.env={spec!r}")
