"""scripts/simulate_gate.py reproduces the domain reference's executed table with the real gate."""
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("simulate_gate", ROOT / "scripts" / "simulate_gate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_uniform_latency_bound_exact_and_reached():
    sim = load()
    for S in (0, 1, 2, 4):
        ages, _ = sim.run(S)
        assert ages.size and ages.max() == S


def test_jittered_latency_overshoots_but_mean_tracks():
    sim = load()
    for S, observed in ((1, 2), (2, 4), (4, 7)):
        ages, _ = sim.run(S, latency=(1, 6))
        assert ages.max() == observed > S
        assert abs(ages.mean() - S) < 1.0
    assert sim.run(2, latency=(1, 3))[0].max() < sim.run(2, latency=(1, 12))[0].max()


def test_ungated_age_is_concurrency_over_batch_minus_one():
    sim = load()
    for C in (16, 32, 64, 128, 256):
        assert sim.run(10**9, steps=80, concurrent=C)[0].max() == C // 8 - 1
    for C in (16, 64, 256):
        assert sim.run(2, steps=80, concurrent=C)[0].max() == min(2, C // 8 - 1)


def test_resume_burst_with_and_without_recovery():
    sim = load()
    bad_ages, bad_admits = sim.run(2, recover_at=40, fix_recovery=False, concurrent=10**6)
    good_ages, good_admits = sim.run(2, recover_at=40, fix_recovery=True, concurrent=10**6)
    assert (bad_admits[0], good_admits[0]) == (344, 24)
    assert bad_ages.max() == 42 and good_ages.max() == 2
    clip_ages, clip_admits = sim.run(2, recover_at=40, fix_recovery=False, concurrent=64)
    assert clip_admits[0] == 64 and clip_ages.max() == 7


def test_script_prints_the_reference_line():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "simulate_gate.py")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    first = out.splitlines()[0]
    assert first == ("uniform latency: max age == S for S in 0,1,2,4 | jittered latency S=1/2/4 -> "
                     "[2, 4, 7] | ungated max age by concurrency {16: 1, 32: 3, 64: 7, 128: 15, 256: 31}"
                     " | resume burst 344 vs 24 admissions, max age 42 vs 2")
