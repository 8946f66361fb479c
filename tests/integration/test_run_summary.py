"""What a user sees on the console: a tqdm bar on a terminal (a real pty), plain periodic lines off
one, and a summary paragraph at the end of every run whose numbers are the run's own (checked
against metrics.jsonl), including on a resumed launch and on a run stopped by SIGTERM."""
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios

import numpy as np

from tests.integration.lifecycle import ROOT, run, start, wait_for_step


def _summary(stderr):
    lines = [line for line in stderr.splitlines() if line.startswith("run summary: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def _steps(run_dir):
    return [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if r["kind"] == "step"]


def test_summary_numbers_are_the_runs_own(tmp_path):
    out = run(tmp_path, "run.total_steps=30", "run.progress=true")
    assert out.returncode == 0, out.stderr[-2000:]
    steps = _steps(tmp_path)
    line = _summary(out.stderr)
    r = np.array([s["reward_mean"] for s in steps])
    assert "steps 1-30 of 30 in " in line
    assert f"reward {r[:10].mean():.3f} (first 10) -> {r[-10:].mean():.3f} (last 10)" in line
    assert f"head age max {max(s['age_max'] for s in steps)}, " \
           f"p99 {max(s['age_p99'] for s in steps):g} (S=2)" in line
    assert "worker restarts 0; resumes 0; " in line and f"run dir {tmp_path}" in line
    plain = [x for x in out.stderr.splitlines() if x.startswith("step ")]
    assert plain and plain[-1].startswith("step 30/30 (100%)") and "steps/s" in plain[-1]
    assert "\r" not in out.stderr                      # off a terminal: no bar redraws


def test_resumed_launch_summarises_its_own_steps(tmp_path):
    assert run(tmp_path, "run.total_steps=20").returncode == 0
    out = run(tmp_path, "run.total_steps=30", "run.resume=auto")
    assert out.returncode == 0, out.stderr[-2000:]
    line = _summary(out.stderr)
    r = np.array([s["reward_mean"] for s in _steps(tmp_path)][20:])
    assert "steps 21-30 of 30" in line and "resumes 1 (at step 20)" in line
    assert f"-> {r.mean():.3f} (last 10)" in line


def test_a_stopped_run_ends_with_its_summary(tmp_path):
    proc = start(tmp_path, "run.total_steps=100000")
    wait_for_step(proc, tmp_path, 5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    k = _steps(tmp_path)[-1]["step"]
    assert f"steps 1-{k} of 100000" in _summary(err)


def test_a_terminal_gets_a_tqdm_bar(tmp_path):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))   # 30 rows, 120 cols
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", "--config", "configs/sim.yaml",
                             f"run.dir={tmp_path}", "run.total_steps=20", "run.progress=true"],
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:             # the child closed the pty
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert re.search(r"20/20 \[[^\]]*step/s", text), text[-2000:]     # tqdm's count, rate and ETA
    assert "reward " in text and "age_max " in text and "run summary: " in text
