"""scripts/bench_endpoint.py (#38) measures the agent endpoint's own CPU per call against a bare
aiohttp echo server on the same stack, the client's apart, and pooled vs per-call clients; one
short round here, its figures never asserted (the measure is in the README)."""
import json
import subprocess
import sys

import pytest

from tests.integration.lifecycle import ROOT

pytest.importorskip("openai")
pytest.importorskip("aiohttp")


def test_bench_endpoint_reports_server_cpu_per_call_and_the_ratios(tmp_path):
    out = subprocess.run([sys.executable, "scripts/bench_endpoint.py", "--rounds", "1", "--episodes", "2",
                          "--per-call-calls", "4", "--tokens", "8,16", "--json", str(tmp_path / "out.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for needle in ("server CPU per call (endpoint threads)", "echo server CPU per call", "server / echo",
                   "client CPU per call", "pooled / client per call", "server CPU per completion token"):
        assert needle in out.stdout, out.stdout
    table = json.loads((tmp_path / "out.json").read_text())
    assert set(table) == {"8", "16"}
    for col in table.values():
        assert col["server_ms"][0] > 0 and col["echo_ms"][0] > 0 and col["pooled_calls_s"][0] > 0
