"""The hard age bound (rollout.max_observed_offpolicyness): on a jittered sim run whose long tail
overshoots the gate's S by far, no trained token's head is older than M; rollouts that cannot meet
it are aborted in flight and their prompts re-admitted, so every prompt is still trained exactly
once. Unset, step lines are what they were."""
import json
import subprocess
import sys

import numpy as np

from orchestrator.run.durable import read_record
from shm.codec import decode
from tests.integration.lifecycle import ROOT, run, steps, trained_prompt_ids

M = 3
LONG_TAIL = ["run.total_steps=40", "inference.sim.latency=lognormal", "inference.sim.latency_s=0.1",
             "inference.sim.lognormal_sigma=1.5", "actor.sim.step_time_s=0.1",
             "rollout.max_concurrent_rollouts=64", "rollout.filter_zero_std=false", "run.seed=0"]


def head_ages(run_dir, total):
    ages = []
    for k in range(1, total + 1):
        b = decode(read_record(str(run_dir / "batches" / f"step_{k:08d}.rec")))
        for i in range(b.n):
            sl = b.seq(i)
            v = b.versions[sl][b.loss_mask[sl].astype(bool)]
            if v.size:
                ages.append(b.version - int(v.min()))
    return np.array(ages)


def test_long_tail_overshoots_without_the_bound(tmp_path):
    out = run(tmp_path, *LONG_TAIL)
    assert out.returncode == 0, out.stderr
    assert head_ages(tmp_path, 40).max() > M              # the seed violates M without the bound
    assert all("aborted" not in s for s in steps(tmp_path))  # unset: the step lines of before


def test_hard_bound_holds_and_every_prompt_is_trained_once(tmp_path):
    out = run(tmp_path, *LONG_TAIL, f"rollout.max_observed_offpolicyness={M}")
    assert out.returncode == 0, out.stderr
    ages = head_ages(tmp_path, 40)
    assert ages.size == 40 * 8 and ages.max() <= M
    s = steps(tmp_path)
    assert max(x["age_max"] for x in s) <= M
    assert sum(x["aborted"] + x["dropped"] for x in s) > 0      # the bound had work to do
    # every abort is answered by its worker and released: what waits is bounded by the aborts in
    # flight, not by the run's length (it held every abort whose result never came before)
    aborted = sum(x["aborted"] for x in s)
    assert aborted >= 10 and max(x["aborts_pending"] for x in s) < aborted / 2
    assert trained_prompt_ids(tmp_path, 40) == list(range(40 * 8))
    audit = subprocess.run([sys.executable, "-m", "orchestrator.audit", str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert json.loads(audit.stdout)["ok"], audit.stdout
