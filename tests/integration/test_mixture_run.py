"""A dataset mixture (`task.datasets`) through the launcher on the torch backends: two JSONL sources
with their own rewards and eval files, weights 3 : 1. Step lines and eval lines carry
`reward_mean/<name>` per source; each source's reward sees its row's `data_source`; the run is
deterministic, and a kill -9 and resume gives the run that never stopped, batches and weights to
the bit (the stream is a pure function of seed and index). Bad sources are exit 2, one line."""
import json

import pytest

from tests.integration.lifecycle import steps
from tests.integration.test_deterministic import assert_same_run, kill_9_and_resume, launch

pytest.importorskip("datasets")

# raises (and so fails the run, task.reward_on_error=error) unless the row names its source
TAGGED = '''
def score(completion, row, ids):
    assert row["data_source"] == "rev", row
    answer = row["answer"]
    return sum(a == b for a, b in zip(completion, answer)) / len(answer)
'''


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mixture(d):
    d.mkdir(parents=True, exist_ok=True)
    copy = [{"prompt": f"{i:02d}>", "answer": f"{i:02d}"} for i in range(100)]
    rev = [{"prompt": f"{i:02d}>>", "answer": f"{i:02d}"[::-1]} for i in range(40)]
    write(d / "copy.jsonl", copy[:80]), write(d / "copy_test.jsonl", copy[80:])
    write(d / "rev.jsonl", rev[:30]), write(d / "rev_test.jsonl", rev[30:])
    (d / "tagged.py").write_text(TAGGED)
    return ("task.datasets=[{path: %s/copy.jsonl, weight: 3, name: copy, reward: digits, "
            "eval_path: %s/copy_test.jsonl}, {path: %s/rev.jsonl, name: rev, reward: '%s/tagged.py:score', "
            "eval_path: %s/rev_test.jsonl}]" % (d, d, d, d, d))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    source = mixture(root / "data")
    launch(root / "run", source)
    return root, source


def test_step_and_eval_lines_report_each_source(mixed):
    root, _ = mixed
    recs = [json.loads(x) for x in open(root / "run" / "metrics.jsonl")]
    step_lines = [r for r in recs if r.get("kind") == "step"]
    assert len(step_lines) == 14
    # 8 groups a batch at 3 : 1: a batch lacks the small source with chance (3/4)^8 = 0.1
    assert sum("reward_mean/copy" in r for r in step_lines) >= 12
    assert sum("reward_mean/rev" in r for r in step_lines) >= 7
    for r in step_lines:
        means = [r[k] for k in ("reward_mean/copy", "reward_mean/rev") if k in r]
        assert min(means) - 1e-9 <= r["reward_mean"] <= max(means) + 1e-9, r
    evals = [r for r in recs if r.get("kind") == "eval"]
    assert [e["step"] for e in evals] == [7, 14]
    for e in evals:                         # every eval prompt of both files: 20 + 10
        assert e["prompts"] == 30 and {"reward_mean/copy", "reward_mean/rev"} <= set(e)
        want = (20 * e["reward_mean/copy"] + 10 * e["reward_mean/rev"]) / 30
        assert e["reward_mean"] == pytest.approx(want, abs=1e-6)


# slow (two more launches, ~17 s): the default suite keeps the stream's purity (tests/unit/
# test_mixture.py, any lookup order) and kill -9 resume equality on one dataset (test_deterministic)
@pytest.mark.slow
def test_kill_9_and_resume_equals_the_uninterrupted_mixture(mixed, tmp_path):
    root, source = mixed
    kill_9_and_resume(tmp_path / "run", source)
    assert_same_run(root / "run", tmp_path / "run")
    per = lambda d: [{k: v for k, v in r.items() if k.startswith("reward_mean/")} for r in steps(d)]
    assert per(root / "run") == per(tmp_path / "run")        # the per-source fields too


@pytest.mark.parametrize("sources, needle", [
    ("[{path: %s/copy.jsonl, reward: digits}, {path: %s/gone.jsonl, reward: digits}]",
     "task.datasets[1].path"),
    ("[{path: %s/copy.jsonl, reward: digits}, {path: %s/rev.jsonl, reward: '%s/nope.py:score'}]",
     "task.datasets[1].reward of source 'rev'"),
    ("[{path: %s/copy.jsonl, reward: digits}, {path: %s/rev.jsonl}]", "task.datasets[1] (rev) has no reward"),
])
def test_a_bad_source_is_exit_2_naming_it(tmp_path, launch_main, sources, needle):
    d = tmp_path / "data"
    mixture(d)
    spec = sources % ((d,) * sources.count("%s"))
    code, err = launch_main("--config", "configs/default.yaml", f"run.dir={tmp_path / 'run'}",
                            f"task.datasets={spec}", "eval.every_steps=0")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


def test_the_report_plots_each_sources_reward(mixed, tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from orchestrator.observe.report import report

    root, _ = mixed
    s = report(str(root / "run"), str(tmp_path / "rep"))
    assert "sources" in s["plots"], s.get("skipped_plots")
    with Image.open(tmp_path / "rep" / "sources.png") as im:
        assert im.format == "PNG" and im.width >= 300 and im.height >= 300
