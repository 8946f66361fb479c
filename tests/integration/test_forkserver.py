"""Workers start from the run's fork server (`orchestrator.runtime.forkserver`): it is the workers'
parent and the supervisor's child, ignores SIGINT and SIGTERM, preloads torch only on CPU-only torch
runs, ends with the run (its end, a stop signal, or the supervisor's SIGKILL: test_parent_death),
and a signal to the whole process group while it is still importing torch stops the run within its
bound, the supervisor never blocked on the server's imports."""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil

from orchestrator.config import load_config
from orchestrator.runtime import forkserver, scratch
from orchestrator.runtime.forkserver import TORCH, WORKERS, preload_for
from tests.fresh import fresh_python
from tests.integration.lifecycle import (ROOT, all_gone, descendants, signal_and_check, start,
                                         wait_for_step, worker_pids)

BOUND = 3        # run.shutdown_timeout_s of the signal test; the exit is due within BOUND + 2 s
IGNORED = (signal.SIGINT, signal.SIGTERM)


def _ignored(pid):
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(x.split()[1], 16) for x in f if x.startswith("SigIgn:"))
    return {s for s in IGNORED if mask & (1 << (s - 1))}


def _is_server(p):
    return "multiprocessing.forkserver" in " ".join(p.cmdline())


def test_preload_is_torch_only_on_cpu_torch_runs():
    assert preload_for(load_config(None, [])) == WORKERS + TORCH              # the default job
    assert preload_for(load_config(None, ["actor.lora={rank: 4}"]))[-1] == "peft"
    for gpu in (["inference.devices=['0']"], ["actor.device='0'"]):
        assert preload_for(load_config(None, gpu)) == WORKERS                 # CUDA pinning first
    assert preload_for(load_config("configs/sim.yaml", [])) == WORKERS


def test_the_gpu_preload_imports_no_torch():
    """Where workers get CUDA devices, the server must not have imported torch: a worker sets
    CUDA_VISIBLE_DEVICES before its own import (and the server's preload is all it inherits)."""
    out = fresh_python("import importlib, sys\n"
                       "from orchestrator.runtime.forkserver import INIT, WORKERS\n"
                       "for m in (INIT,) + WORKERS: importlib.import_module(m)\n"
                       "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr + out.stdout


def test_workers_are_forked_by_the_runs_server_which_ends_with_the_run(tmp_path):
    # ~4 s of steps: still running while its processes are looked at, even on a busy host
    proc = start(tmp_path, "run.total_steps=80", "actor.sim.step_time_s=0.05")
    wait_for_step(proc, tmp_path, 2)
    workers = {name: psutil.Process(pid) for name, pid in worker_pids(tmp_path).items()}
    servers = {p.parent().pid for p in workers.values()}
    assert len(servers) == 1
    server = psutil.Process(servers.pop())
    assert _is_server(server) and server.parent().pid == proc.pid
    assert _ignored(server.pid) == set(IGNORED)         # a group signal cannot kill the server
    everyone = descendants(proc.pid)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert all_gone(everyone, timeout=1.0) == []        # reaped by the supervisor before it exits
    logs = [open(tmp_path / "logs" / f"{name}.log").read() for name in workers]
    assert all(f"forked by the fork server {server.pid} (no torch preloaded)" in x for x in logs)


def test_a_torch_run_worker_finds_torch_preloaded(torch_run_dir):
    log = open(os.path.join(torch_run_dir, "logs", "trainer0.log")).read()
    assert "(torch preloaded)" in log


def test_group_sigterm_while_the_server_imports_torch_stops_the_run_in_bound(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config",
                             "configs/default.yaml", f"run.dir={tmp_path}", "run.progress=false",
                             f"run.shutdown_timeout_s={BOUND}"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline, server = time.monotonic() + 60, None
    while server is None and time.monotonic() < deadline and proc.poll() is None:
        server = next((p for p in descendants(proc.pid) if _is_server(p)), None)
        time.sleep(0.005)
    assert server is not None, proc.communicate(timeout=30)
    while time.monotonic() < deadline and _ignored(server.pid) != set(IGNORED):
        time.sleep(0.005)          # its first import: from here a group signal is the supervisor's
    ready = glob.glob(f"{tempfile.gettempdir()}/{scratch.PREFIX}{proc.pid}-*/{forkserver.READY}")
    assert ready == []             # still importing (torch and transformers: seconds)
    signal_and_check(proc, signal.SIGTERM, BOUND, to_group=True)
    assert not (tmp_path / "logs" / "pids.json").exists()       # no worker was started
