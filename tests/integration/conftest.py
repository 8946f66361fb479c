"""Real short runs shared by the tools' tests (report, inspect, metric sinks): each is launched once
per session and must not be modified by a test (copy it first). `launch_main`: the launcher's
refusals checked in this process."""
from __future__ import annotations

import pytest

from tests.integration.lifecycle import ROOT, run

SHARED_RUNS = ("sim_run_dir", "torch_run_dir")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`--dist loadgroup`), the tests that read a shared session run go to one
    worker, so that each run is made once, not once per worker."""
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in SHARED_RUNS):
            item.add_marker(pytest.mark.xdist_group("shared_runs"))


@pytest.fixture
def launch_main(monkeypatch, capfd):
    """`launch_main(*args, cwd=ROOT) -> (exit code, stderr)`: `orchestrator.launch.main` called in
    this process (its imports paid once per session, not once per case), for input that must be
    refused before anything starts. A launch that gets as far as starting a run fails the test
    instead of running. Each test file keeps one case through a real `python -m
    orchestrator.launch` process for the process-level contract (exit status, stderr)."""
    from orchestrator import launch

    def started(*_, **__):
        raise AssertionError("the launch started a run: its input was not refused")
    monkeypatch.setattr(launch, "_run", started)

    def call(*args, cwd=ROOT):
        monkeypatch.chdir(cwd)
        capfd.readouterr()
        code = launch.main([str(a) for a in args])
        return code, capfd.readouterr().err
    return call


@pytest.fixture(scope="session")
def sim_run_dir(tmp_path_factory):
    """The sim backends, 40 steps in two launches: the second resumes from the checkpoint at 20
    (a `resume` event, a `resumed` step line)."""
    d = tmp_path_factory.mktemp("sim_run") / "run"
    for total in (20, 40):
        out = run(d, f"run.total_steps={total}", "run.resume=auto", "metrics.interval_s=0.2")
        assert out.returncode == 0, out.stderr[-2000:]
    return d


@pytest.fixture(scope="session")
def torch_run_dir(tmp_path_factory):
    """The embedded default (tiny torch model, copy2 task), 100 steps in two launches (resumed at
    step 80), eval every 50 steps: real tokens, rewards, advantages and eval lines, and the default
    suite's run of the async pipeline that learns (test_torch_learns). run.deterministic, seed 0:
    the same run every time (the 80-step launch's end has no batch 81-82; the resumed version
    makes them, as for any extended deterministic run)."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("torch_run") / "run"
    for total in (80, 100):
        out = run(d, f"run.total_steps={total}", "run.resume=auto", "run.checkpoint_every=40",
                  "eval.every_steps=50", "metrics.interval_s=0.5", "run.progress=false",
                  "run.deterministic=true", "run.seed=0", config="configs/default.yaml", timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
    return d
