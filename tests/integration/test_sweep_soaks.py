"""scripts/sweep_soaks.py on two seeds of a short default job: a line per seed whose figures are
the run's own (recomputed here from its metrics.jsonl), the summary's min / median / max and the
count of seeds holding the bound; an unknown soak is exit 2 in one line."""
import json
import statistics
import subprocess
import sys

import pytest

from tests.integration.lifecycle import ROOT

pytest.importorskip("torch")


@pytest.mark.slow            # two 20-step launches of the default job
def test_sweep_reports_each_seed_and_the_spread(tmp_path):
    out = subprocess.run([sys.executable, "scripts/sweep_soaks.py", "--soaks", "default",
                          "--seeds", "0-1", "--set", "run.total_steps=20", "--set",
                          "eval.every_steps=0", "--runs-dir", str(tmp_path), "--json",
                          str(tmp_path / "out.json")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "out.json").read_text())["results"]["default"]
    assert [r["seed"] for r in results] == [0, 1]
    lasts = []
    for r in results:
        recs = [json.loads(x) for x in open(tmp_path / f"default-s{r['seed']}" / "metrics.jsonl")]
        rewards = [x["reward_mean"] for x in recs if x["kind"] == "step"]
        assert len(rewards) == 20 and r["rc"] == 0
        first, last = statistics.fmean(rewards[:10]), statistics.fmean(rewards[-10:])
        assert r["first"] == round(first, 4) and r["last"] == round(last, 4)
        assert r["ok"] == (last >= 0.8 and last - first >= 0.5)
        lasts.append(r["last"])      # the summary spans the per-seed figures as reported
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("default seed 0: ") and lines[1].startswith("default seed 1: ")
    held = sum(r["ok"] for r in results)
    assert lines[2] == (f"default: last-10 reward min {min(lasts):.3f} / median "
                        f"{statistics.median(lasts):.3f} / max {max(lasts):.3f} over 2 runs; "
                        f"holds {held}/2 (last >= 0.8, gain >= 0.5)")

    bad = subprocess.run([sys.executable, "scripts/sweep_soaks.py", "--soaks", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown soak(s) nope" in bad.stderr
