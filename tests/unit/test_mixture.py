"""A dataset mixture (`task.datasets`, `data/mixture.py`): which source each stream index draws,
each source's own epochs, rows numbered across sources, `data_source` on the row, per-source
means, and the config's refusals."""
import json

import numpy as np
import pytest
from pydantic import ValidationError

from orchestrator.data.mixture import BLOCK, SourceDraws, by_source, source_means
from tests.workload import workload_config

pytest.importorskip("datasets")


def test_sources_are_drawn_in_proportion_to_their_weights():
    draws = SourceDraws([1.0, 3.0, 0.5], seed=0)
    n = 3 * BLOCK + 123
    got = np.bincount([draws.locate(i)[0] for i in range(n)], minlength=3) / n
    want = np.array([1.0, 3.0, 0.5]) / 4.5
    assert np.abs(got - want).max() < 0.01, got        # binomial sd here is about 0.003


def test_a_draw_is_a_pure_function_of_seed_and_index():
    """Looked up in any order by a fresh instance (a resumed run), index i names the same source
    and position; each source's positions run 0, 1, 2, ... in stream order (no prompt of a source
    skipped or taken twice), across block edges too."""
    n = 2 * BLOCK + 50
    a = SourceDraws([2.0, 1.0], seed=7)
    forward = [a.locate(i) for i in range(n)]
    b = SourceDraws([2.0, 1.0], seed=7)
    order = np.random.default_rng(1).permutation(n)
    shuffled = {int(i): b.locate(int(i)) for i in order}
    assert [shuffled[i] for i in range(n)] == forward
    for s in (0, 1):
        assert [pos for src, pos in forward if src == s] == list(range(sum(src == s for src, _ in forward)))
    other = SourceDraws([2.0, 1.0], seed=8)
    assert [other.locate(i)[0] for i in range(200)] != [src for src, _ in forward[:200]]


def test_source_means_cover_only_the_sources_present():
    got = source_means(["a", "b", "a"], [np.array([1.0, 0.0]), np.array([0.5]), np.array([1.0, 1.0])])
    assert got == {"reward_mean/a": 0.75, "reward_mean/b": 0.5}
    assert source_means([], []) == {}


def test_by_source_scores_each_row_with_its_sources_function():
    fn = by_source({"a": lambda text, row, ids: 1.0, "b": lambda text, row, ids: len(text)})
    assert fn("xyz", {"data_source": "a"}, []) == 1.0 and fn("xyz", {"data_source": "b"}, []) == 3


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture()
def two_sources(tmp_path):
    big = write(tmp_path / "big.jsonl", [{"prompt": f"{i:02d}>", "answer": f"{i:02d}"} for i in range(40)])
    small = write(tmp_path / "small.jsonl", [{"prompt": f"{i}>>", "answer": f"{i}"} for i in range(3)])
    small_eval = write(tmp_path / "small_test.jsonl", [{"prompt": f"{i}>>", "answer": f"{i}"}
                                                      for i in range(5, 7)])
    return [{"path": big, "weight": 1.0, "reward": "digits"},
            {"path": small, "weight": 1.0, "name": "tiny", "reward": "exact_match",
             "eval_path": small_eval}]


def test_each_source_walks_its_own_epochs_and_rows_are_numbered_across_sources(two_sources):
    from orchestrator.data.workload import load_prompts, load_rows

    cfg = workload_config(datasets=two_sources, num_eval_prompts=None)
    mix = load_prompts(cfg)
    assert mix.labels == ["big", "tiny"]
    rows = load_rows(cfg)
    taken = {"big": [], "tiny": []}
    for i in range(60):
        _, ids, row = mix.train_prompt(i)
        got = rows(False, row)
        assert got["data_source"] == mix.source_of(i)
        taken[got["data_source"]].append(got["prompt"])
    tiny = taken["tiny"]
    assert len(tiny) >= 9
    for e in range(len(tiny) // 3):         # every row once per epoch, a new order each epoch
        assert sorted(tiny[3 * e:3 * e + 3]) == ["0>>", "1>>", "2>>"]
    assert len(set(taken["big"][:40])) == min(40, len(taken["big"]))
    evals = mix.eval_prompts()              # the big source has no eval_path: the small one's only
    assert [mix.eval_source(r) for _, _, r in evals] == ["tiny", "tiny"]
    assert sorted(rows(True, r)["prompt"] for _, _, r in evals) == ["5>>", "6>>"]
    again = load_prompts(cfg)               # a resume: the same stream, the same identity
    assert [again.train_prompt(i)[2] for i in range(60)] == [mix.train_prompt(i)[2] for i in range(60)]
    assert again.identity == mix.identity
    reweighted = load_prompts(workload_config(datasets=[two_sources[0], {**two_sources[1], "weight": 2.0}],
                                              num_eval_prompts=None))
    assert reweighted.identity["digest"] != mix.identity["digest"]   # a resume refuses it


def test_a_mixture_scores_each_source_with_its_own_reward(two_sources):
    from orchestrator.data.tokens import load_tokens
    from orchestrator.data.workload import load_rows
    from tests.workload import prompts_and_reward

    cfg = workload_config(datasets=two_sources, num_eval_prompts=None)
    mix, reward = prompts_and_reward(cfg)
    rows, tok = load_rows(cfg), load_tokens(None).tokenizer
    tiny = mix.train_prompt(next(i for i in range(50) if mix.source_of(i) == "tiny"))[2]
    big = mix.train_prompt(next(i for i in range(50) if mix.source_of(i) == "big"))[2]
    half = rows(False, big)["answer"][0] + "9"           # one of two digits right
    ids = tok.encode(half, add_special_tokens=False)
    assert reward(big, ids) == pytest.approx(0.5, abs=0.2)  # digits: partial credit
    assert reward(tiny, ids) == 0.0                      # exact_match: all or nothing


@pytest.mark.parametrize("task, needle", [
    ({"datasets": [{"path": "a.jsonl", "reward": "digits"}], "dataset": "b.jsonl"},
     "task.datasets and task.dataset"),
    ({"datasets": [{"path": "x/a.jsonl", "reward": "digits"}, {"path": "y/a.jsonl", "reward": "digits"}]},
     "two sources are called 'a'"),
    ({"datasets": [{"path": "a.jsonl"}]}, "task.datasets[0] (a) has no reward"),
    ({"datasets": [{"path": "a.jsonl", "weight": 0, "reward": "digits"}]}, "weight"),
    ({"datasets": [{"path": "a.jsonl", "name": "bad name!", "reward": "digits"}]}, "name"),
    ({"datasets": [{"path": "a.jsonl", "reward": "digits"}], "name": "copy2"}, "exclusive"),
])
def test_bad_mixtures_are_refused_naming_the_key(task, needle):
    with pytest.raises(ValidationError) as got:
        workload_config(**task)
    assert needle in str(got.value), str(got.value)


def test_a_mixture_without_eval_files_turns_eval_off_with_a_note(two_sources):
    from orchestrator.config import load_config

    spec = "[{path: %s, reward: digits}]" % two_sources[0]["path"]
    cfg = load_config(None, [f"task.datasets={spec}", "eval.every_steps=5"])
    assert cfg.eval.every_steps == 0 and cfg.task.name == "dataset"
    assert any("task.datasets and no eval_path on any source" in n for n in cfg.notes), cfg.notes
    with_eval = "[{path: %s, reward: digits, eval_path: %s}]" % (two_sources[0]["path"],
                                                                 two_sources[1]["eval_path"])
    assert load_config(None, [f"task.datasets={with_eval}", "eval.every_steps=5"]).eval.every_steps == 5
