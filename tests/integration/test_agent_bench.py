"""scripts/bench_pipeline.py --backend agent (#26) runs the lookup job in process and through the
built-in HTTP agent and prints both rows and their ratio with its spread; the ratio's value is the
benchmark's output, never asserted here (the first measure is in the README)."""
import json
import subprocess
import sys

import pytest

from tests.integration.lifecycle import ROOT

pytest.importorskip("torch")
pytest.importorskip("openai")
pytest.importorskip("aiohttp")


@pytest.mark.slow            # two launches of 8 steps: ~60 s on 2 cores
def test_bench_pipeline_agent_backend_reports_the_ratio(tmp_path):
    out = subprocess.run([sys.executable, "scripts/bench_pipeline.py", "--backend", "agent", "--rounds", "1",
                          "--steps", "8", "--json", str(tmp_path / "out.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()
            if line.startswith(("in-process", "agent (HTTP)"))}
    assert set(rows) == {"in-process", "agent"}
    assert float(rows["in-process"][1]) > 0 and float(rows["agent"][2]) > 0     # episodes/s
    assert "agent / in-process episodes/s:" in out.stdout and "per round" in out.stdout
    table, = json.loads((tmp_path / "out.json").read_text())
    assert table["backend"] == "agent" and table["ratio_min"] <= table["agent_over_env"] <= table["ratio_max"]
    assert table["agent_over_env"] == pytest.approx(table["agent_episodes_per_s"] / table["env_episodes_per_s"])
