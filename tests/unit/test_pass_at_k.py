"""orchestrator.algo.pass_at_k against the exact binomial formula 1 - C(n-c, k) / C(n, k) (Chen et
al. 2021), computed in exact rationals, on random cases and at n where C(n, k) overflows floats;
and eval.pass_k's refusals (one line naming the key)."""
import math
import random
from fractions import Fraction

import pytest

from orchestrator.algo import pass_at_k
from orchestrator.config import ConfigError, load_config


def exact(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_random_cases_match_the_binomial_formula():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 300)
        c, k = rng.randint(0, n), rng.randint(1, n)
        assert pass_at_k(n, c, k) == pytest.approx(float(exact(n, c, k)), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("n, c, k", [(5000, 3, 1000), (2000, 1, 1), (4096, 40, 64), (1500, 0, 700)])
def test_large_n_stays_exact(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(float(exact(n, c, k)), rel=1e-10, abs=1e-15)


def test_where_binomials_overflow_floats():
    with pytest.raises(OverflowError):
        float(math.comb(5000, 1000))         # the ratio of binomials in floats is not an option
    assert 0.0 < pass_at_k(5000, 3, 1000) < 1.0


def test_edges():
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0          # n - c < k: every 3 of 10 hold a correct one
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(1, 1, 1) == 1.0


@pytest.mark.parametrize("args, word", [((4, 2, 5), "k"), ((4, 2, 0), "k"), ((4, 5, 1), "c"),
                                         ((4, -1, 1), "c"), ((4.0, 2, 1), "n"), ((4, True, 1), "c")])
def test_bad_arguments_name_themselves(args, word):
    with pytest.raises(ValueError, match=f"pass_at_k: {word} "):
        pass_at_k(*args)


@pytest.mark.parametrize("overrides, text", [
    (["eval.samples_per_prompt=4", "eval.pass_k=[1,5]"], "eval.pass_k [5] outside 1..eval.samples_per_prompt=4"),
    (["eval.pass_k=[1,1]"], "eval.pass_k [1, 1] repeats a k"),
    (["eval.pass_k=[0]"], "eval.pass_k [0] outside"),
])
def test_pass_k_is_refused_in_one_line(overrides, text):
    with pytest.raises(ConfigError) as exc:
        load_config(None, overrides)
    assert text in str(exc.value) and "\n" not in str(exc.value)
