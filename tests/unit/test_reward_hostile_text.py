"""The built-in rewards are total on model output (orchestrator.data.rewards): any text, any length,
any unicode, huge numbers and exponents, huge `\\frac` parts, deep braces: a score of 0 or 1, never
an exception, in bounded time and memory."""
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import TaskConfig
from orchestrator.data.rewards import resolve_reward
from orchestrator.data.tokens import load_tokens

TOKENS = load_tokens(None)


def _fn(name):
    task = TaskConfig(name="dataset", dataset="unused.jsonl", reward=name)
    return resolve_reward(task, TOKENS)[1]


MATH = _fn("math_answer")
BUILTINS = [MATH, _fn("exact_match")]


HUGE = [
    ("9" * 400, "#### 1", False),                       # the last number has 400 digits
    ("9" * 400, "#### " + "9" * 400, True),
    ("so it is " + "9" * 400, "#### " + "9" * 399 + "8", True),    # 1e-6 relative tolerance
    ("\\boxed{1e400}", "#### 1e400", True),
    ("\\boxed{1e400}", "#### 2e400", False),
    ("\\boxed{1e400}", "#### 10e399", True),            # compared as numbers, not as text
    ("#### 2e309", "#### 2e309", True),
    ("#### 2e309", "#### 3", False),
    ("\\boxed{-1e400}", "#### 1e400", False),
    ("\\boxed{1e-400}", "#### 0", True),                # within the absolute tolerance
    ("\\boxed{\\frac{" + "7" * 450 + "}{" + "7" * 450 + "}}", "#### 1", True),
    ("\\boxed{\\frac{1}{0}}", "#### 1", False),
    ("\\boxed{" + "1" * 5000 + "}", "#### " + "1" * 5000, True),  # too long for a number: as text
    ("\\boxed{1_000}", "#### 1000", True),
    ("\\boxed{\u0663}", "#### 3", True),                # an Arabic-Indic digit
]


@pytest.mark.parametrize("text, ref, ok", HUGE, ids=[f"{t[:24]}~{r[:24]}" for t, r, _ in HUGE])
def test_math_answer_on_huge_numbers(text, ref, ok):
    assert MATH(text, {"answer": ref}, []) == float(ok)


def test_huge_exponents_are_not_expanded():
    """`\\boxed{1e10000000}` made Fraction build a ten-million-digit integer (6 s; 50 s at 1e8) that
    kept a core busy after the pool gave up on it; 1e99999999999999999999999 exhausted memory: run in
    a subprocess limited to 4 GiB of address space that must finish in 120 s (a generous bound: it
    takes milliseconds past the imports)."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from orchestrator.config import TaskConfig
        from orchestrator.data.rewards import resolve_reward
        from orchestrator.data.tokens import load_tokens
        task = TaskConfig(name="dataset", dataset="unused.jsonl", reward="math_answer")
        fn = resolve_reward(task, load_tokens(None))[1]
        for e in ("1e10000000", "1e100000000", "-1e-100000000", "1e10000000/3",
                  "1e99999999999999999999999", "9.9e999999999999999999", "\\\\frac{1e9999999}{3}"):
            for ref in ("#### " + e, "#### 1e10000001", "#### 5"):
                print(e, ref, fn("\\\\boxed{" + e + "}", {"answer": ref}, []))
        print(fn("\\\\boxed{1e100000000}", {"answer": "#### 10e99999999"}, []))
    """)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("math_answer spent over 120 s on \\boxed{1e10000000}-style answers")
    assert out.returncode == 0, out.stderr[-2000:]
    scores = [line.split()[-1] for line in out.stdout.splitlines()]
    assert scores == ["1.0", "0.0", "0.0"] * 7 + ["1.0"]      # the last: equal as numbers


def test_very_long_and_deeply_nested_text():
    huge = [
        "{" * 200_000 + "\\boxed{" + "{" * 200_000,
        "\\boxed{" * 100_000 + "7",
        "1," * 300_000,
        "#### " + "9" * 300_000,
        "\\frac{" * 50_000 + "}" * 50_000,
        "1.1." * 200_000 + "####",
        "x" * 3_000_000 + "\\boxed{7}",
    ]
    for text in huge:
        for fn in BUILTINS:
            assert fn(text, {"answer": "#### 7"}, []) in (0.0, 1.0)
    assert MATH("x" * 3_000_000 + "\\boxed{7}", {"answer": "#### 7"}, []) == 1.0


PIECES = st.sampled_from(["\\boxed{", "{", "}", "####", "\\frac{", "e", "E", "-", "+", "/", ".", ",",
                          "$", "%", " ", "\n", "_", "0", "9", "9" * 400, "e400", "e-400",
                          "e5000", "\u0663", "\u00b2", "\ud800", "\x00",
                          "inf", "nan", "Infinity"])
HOSTILE = st.one_of(st.text(max_size=200), st.lists(PIECES, max_size=40).map("".join),
                    st.lists(st.one_of(PIECES, st.text(max_size=5)), max_size=40).map("".join))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion=HOSTILE, ref=HOSTILE)
def test_builtins_never_raise_on_any_text(completion, ref):
    for fn in BUILTINS:
        assert fn(completion, {"answer": ref}, []) in (0.0, 1.0)


NUMBERISH = st.lists(st.sampled_from(["-", "+", ".", "e", "E", "/", "_", ",", "0", "1", "7", "9" * 400,
                                      "e400", "e-400", "e5000",
                                      "\u0663", "%", "$"]), min_size=1, max_size=12).map("".join)


@settings(max_examples=150, deadline=None)
@given(answer=NUMBERISH)
def test_an_answer_always_equals_itself(answer):
    """Whatever parses, or fails to, the same final answer in the completion and in the reference
    scores 1: numbers beyond float range compare consistently."""
    assert MATH(f"so \\boxed{{{answer}}}", {"answer": f"work\n#### {answer}"}, []) == 1.0
