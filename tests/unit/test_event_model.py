"""The zero-overhead event model bench_pipeline divides by: it reproduces the closed forms it
must (a trainer-bound pipeline runs at 1/step_time, S=0 alternates generation and training) and
the real gate's semantics (fixed latency: the head age is at most S; a long tail overshoots it)."""
import pytest

from scripts.event_model import simulate


def test_trainer_bound_pipeline_runs_at_the_step_rate():
    r = simulate(S=2, B=8, C=64, latency_s=0.1, sigma=None, step_time_s=0.1, steps=40)
    assert r.steps_per_s() == pytest.approx(10.0, rel=1e-6)
    assert len(r.ages) == 40 * 8 and max(r.ages) <= 2


def test_synchronous_loop_alternates():
    r = simulate(S=0, B=8, C=64, latency_s=0.1, sigma=None, step_time_s=0.1, steps=20)
    assert r.steps_per_s() == pytest.approx(5.0, rel=1e-6)
    assert max(r.ages) == 0


def test_long_tail_overshoots_the_gate():
    ages = [a for seed in range(3)
            for a in simulate(2, 8, 64, 0.1, 1.5, 0.1, 40, seed=seed).ages]
    assert max(ages) > 2
