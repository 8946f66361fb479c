"""Drive the real StalenessGate through the domain reference's discrete-time model run.

Each tick: admit while capacity > 0, age in-flight rollouts by one tick, accept the ripe ones in
completion order, train every full batch (version += 1). Reproduces the reference's executed table:
uniform latency (max age == S), jittered latency overshoot, ungated concurrency-driven age, and the
resume burst with and without `on_version_recovered`.

    python scripts/simulate_gate.py            # prints the table as one line, plus a JSON line
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from orchestrator.loop.gate import StalenessGate  # noqa: E402


def run(max_staleness, steps=60, batch=8, concurrent=64, latency=(3, 3),
        recover_at=0, fix_recovery=True, seed=0):
    """Return (observed ages of trained rollouts, admissions per tick) as numpy arrays."""
    rng = np.random.default_rng(seed)
    version = [recover_at]
    gate = StalenessGate(max_staleness, batch, concurrent, version=lambda: version[0])
    if recover_at and fix_recovery:
        gate.on_version_recovered(recover_at)
    inflight, done, ages, admitted = [], [], [], []
    lo, hi = latency
    for _ in range(steps):
        n = 0
        while gate.capacity() > 0:
            wait = lo if hi <= lo else int(rng.integers(lo, hi))
            gate.on_enqueued()
            gate.on_submitted()
            inflight.append((version[0], wait))
            n += 1
        admitted.append(n)
        inflight = [(v, t - 1) for v, t in inflight]
        ripe = [v for v, t in inflight if t <= 0]
        inflight = [(v, t) for v, t in inflight if t > 0]
        for _ in ripe:
            gate.on_accepted()
        done.extend(ripe)
        while len(done) >= batch:
            births, done = done[:batch], done[batch:]
            ages.extend(version[0] - v for v in births)
            version[0] += 1
    return np.array(ages), np.array(admitted)


def table() -> dict:
    uniform = {S: int(run(S)[0].max()) for S in (0, 1, 2, 4)}
    jittered = {S: int(run(S, latency=(1, 6))[0].max()) for S in (1, 2, 4)}
    jitter_mean = {S: float(run(S, latency=(1, 6))[0].mean()) for S in (1, 2, 4)}
    ungated = {C: int(run(10**9, steps=80, concurrent=C)[0].max()) for C in (16, 32, 64, 128, 256)}
    gated = {C: int(run(2, steps=80, concurrent=C)[0].max()) for C in (16, 64, 256)}
    bad_ages, bad_admits = run(2, recover_at=40, fix_recovery=False, concurrent=10**6)
    good_ages, good_admits = run(2, recover_at=40, fix_recovery=True, concurrent=10**6)
    clip_ages, clip_admits = run(2, recover_at=40, fix_recovery=False, concurrent=64)
    return {
        "uniform_max_age": uniform,
        "jittered_max_age": jittered,
        "jittered_mean_age": jitter_mean,
        "ungated_max_age": ungated,
        "gated_S2_max_age": gated,
        "resume_burst_admissions": {"unfixed": int(bad_admits[0]), "fixed": int(good_admits[0])},
        "resume_max_age": {"unfixed": int(bad_ages.max()), "fixed": int(good_ages.max())},
        "resume_clipped": {"admissions": int(clip_admits[0]), "max_age": int(clip_ages.max())},
    }


def main() -> None:
    t = table()
    uni = "max age == S for S in 0,1,2,4" if all(v == s for s, v in t["uniform_max_age"].items()) \
        else f"max age {t['uniform_max_age']}"
    print(f"uniform latency: {uni} | "
          f"jittered latency S=1/2/4 -> {list(t['jittered_max_age'].values())} | "
          f"ungated max age by concurrency {t['ungated_max_age']} | "
          f"resume burst {t['resume_burst_admissions']['unfixed']} vs "
          f"{t['resume_burst_admissions']['fixed']} admissions, "
          f"max age {t['resume_max_age']['unfixed']} vs {t['resume_max_age']['fixed']}")
    print(json.dumps(t))


if __name__ == "__main__":
    main()
