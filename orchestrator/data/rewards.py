"""Reward functions: the built-in set and user functions named in `task.reward`.

Contract: a reward is `fn(completion: str, row: dict, completion_ids: list[int]) -> float`:
the completion text (`tokens.completion_text`: final stop token dropped, special tokens skipped),
the dataset row the prompt came from, and the sampled ids (the final stop token included when
sampled). `resolve_reward(task_cfg, tokens) -> (name, fn)` turns `task.reward` into that callable:
- a built-in name: `exact_match` (stripped text equals `row[task.answer_field]`), `math_answer`
  (the last `\\boxed{...}`, else the text after the last `####`, else the last number of the
  completion, compared with the reference's final answer (its `####` part or `\\boxed{}` if any),
  numerically when both parse as numbers: commas, `$`, `%` and spaces ignored, 1e-6 relative
  tolerance; else as normalised text), `digits` (positional over tokens: matches of the completion
  ids against the ids of `row[task.answer_field]` + eos, over their count; the digit tasks' reward).
  Built-ins are total on model output: any text scores 0 or 1, never raises, in time and memory
  bounded by construction. `math_answer` reads a text's last MAX_TEXT_CHARS characters; a `\\boxed{`
  that does not close within MAX_ANSWER_CHARS is unclosed; an answer of at most MAX_NUMBER_CHARS
  characters in `fractions.Fraction`'s grammar (`-1_000.5e-3`, `3/4`, `\\frac{3}{4}`) is a number,
  held as a Decimal of 34 significant digits whatever its exponent (no huge integer is built;
  `1e400` equals `10e399`, `1e-400` equals 0 within 1e-9), compared as |a - b| <= max(1e-6 max(|a|,
  |b|), 1e-9); longer ones, exponents past 10^18 and division by zero compare as text;
- `path/to/file.py:fn` (a file, relative to the working directory; loaded as its own module) or
  `package.module:fn` (imported).
A spec that cannot be resolved (missing file, module, function, not callable) raises `DataError`
naming `task.reward`. Return values are checked by the caller (`reward_pool`).
"""
from __future__ import annotations

import decimal
import importlib
import importlib.util
import os
import re
import sys
from typing import Callable, Optional

from orchestrator.data.tokens import DataError, ModelTokens

RewardFn = Callable[[str, dict, list], float]
BUILTIN = ("exact_match", "math_answer", "digits")
NEEDS_ANSWER = set(BUILTIN)


# ---------------------------------------------------------------------------- math normalisation

_BOXED = "\\boxed{"
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
MAX_TEXT_CHARS = 1 << 20        # a longer text is read from its tail (its final answer is there)
MAX_ANSWER_CHARS = 10_000       # a \boxed{ that does not close within this many characters: unclosed
MAX_NUMBER_CHARS = 1_000        # a longer answer is not parsed as a number (compared as text)
_INT = r"\d+(?:_\d+)*"
_NUMBER_TEXT = re.compile(rf"([-+]?)(?:({_INT})/({_INT})|((?:{_INT}(?:\.(?:{_INT})?)?|\.{_INT})"
                          rf"(?:e[-+]?{_INT})?))", re.IGNORECASE)  # Fraction's grammar, fullmatch
_FRAC = re.compile(r"\\frac\{(-?\d+)\}\{(\d+)\}")
_CTX = decimal.Context(prec=34, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[])
_REL_TOL, _ABS_TOL = decimal.Decimal("1e-6"), decimal.Decimal("1e-9")


def _last_boxed(text: str) -> Optional[str]:
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    i, depth = start + len(_BOXED), 1
    for j in range(i, min(len(text), i + MAX_ANSWER_CHARS)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str, loose: bool) -> Optional[str]:
    """Final answer of a solution text: \\boxed{}, else after '####', else (loose) the last number
    (of the text's last MAX_TEXT_CHARS characters)."""
    text = text[-MAX_TEXT_CHARS:]
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else ""
    if loose:
        last = None
        for m in _NUMBER.finditer(text):
            last = m.group()
        return last
    return text.strip()


def _number(text: str) -> Optional[decimal.Decimal]:
    """`text` as a finite Decimal (34 significant digits, exponents up to +-MAX_EMAX), or None."""
    if len(text) > MAX_NUMBER_CHARS:
        return None
    t = text.strip().replace(",", "").replace("$", "").replace("%", "").replace(" ", "")
    t = t.rstrip(".")
    m = _FRAC.fullmatch(t)
    if m:
        t = f"{m.group(1)}/{m.group(2)}"
    m = _NUMBER_TEXT.fullmatch(t)
    if m is None:
        return None
    sign, num, den, dec = m.groups()
    if dec is not None:
        value = _CTX.create_decimal(dec.replace("_", ""))
    else:
        den = _CTX.create_decimal(den.replace("_", ""))
        if den.is_zero():
            return None
        value = _CTX.divide(_CTX.create_decimal(num.replace("_", "")), den)
    if not value.is_finite():           # an exponent past MAX_EMAX: compared as text
        return None
    return _CTX.minus(value) if sign == "-" else value


def answers_equal(pred: Optional[str], ref: str) -> bool:
    if pred is None:
        return False
    a, b = _number(pred), _number(ref)
    if a is not None and b is not None:
        diff = _CTX.abs(_CTX.subtract(a, b))        # Infinity past MAX_EMAX: not close
        return diff <= _CTX.max(_CTX.multiply(_REL_TOL, _CTX.abs(_CTX.max_mag(a, b))), _ABS_TOL)
    norm = lambda s: re.sub(r"\s+", " ", s.strip().strip(".").lower())   # noqa: E731
    return norm(pred) == norm(ref)


# ----------------------------------------------------------------------------------- built-ins

def _exact_match(field: str) -> RewardFn:
    def exact_match(completion: str, row: dict, completion_ids: list) -> float:
        return float(completion.strip() == str(row[field]).strip())
    return exact_match


def _math_answer(field: str) -> RewardFn:
    def math_answer(completion: str, row: dict, completion_ids: list) -> float:
        ref = extract_answer(str(row[field]), loose=False)
        return float(answers_equal(extract_answer(completion, loose=True), ref or ""))
    return math_answer


def _digits(field: str, tokens: ModelTokens) -> RewardFn:
    tok, eos = tokens.tokenizer, tokens.eos_id

    def digits(completion: str, row: dict, completion_ids: list) -> float:
        target = list(tok(str(row[field]), add_special_tokens=False)["input_ids"]) + [eos]
        got = list(completion_ids)[: len(target)]
        return sum(1 for a, b in zip(got, target) if int(a) == b) / len(target)
    return digits


# ----------------------------------------------------------------------------------- resolution

def load_user_object(spec: str, field: str, what: str = "function"):
    """The object `spec` names, `file.py:name` (a path relative to the cwd) or `module:name`; a
    DataError naming `field` when the file, module or name cannot be loaded (shared by rewards and
    environments)."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise DataError(f"{field}={spec!r}: not 'file.py:{what}' or 'module:{what}'")
    if target.endswith(".py"):
        full = os.path.abspath(target)
        if not os.path.isfile(full):
            raise DataError(f"{field}={spec!r}: no such file {full}")
        mod_name = f"arl_user_{abs(hash(full)):x}"
        module = sys.modules.get(mod_name)
        if module is None:
            mod_spec = importlib.util.spec_from_file_location(mod_name, full)
            module = importlib.util.module_from_spec(mod_spec)
            try:
                mod_spec.loader.exec_module(module)
            except Exception as exc:
                raise DataError(f"{field}={spec!r}: importing {full} failed "
                                f"({type(exc).__name__}: {exc})".splitlines()[0]) from None
            sys.modules[mod_name] = module
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise DataError(f"{field}={spec!r}: cannot import {target} "
                            f"({type(exc).__name__}: {exc})".splitlines()[0]) from None
    obj = getattr(module, name, None)
    if obj is None:
        raise DataError(f"{field}={spec!r}: {target} has no {what} {name!r}")
    return obj


def resolve_reward(task_cfg, tokens: ModelTokens) -> tuple[str, RewardFn]:
    spec = task_cfg.reward if task_cfg.reward is not None else "digits"
    field = task_cfg.answer_field
    if spec == "exact_match":
        return spec, _exact_match(field)
    if spec == "math_answer":
        return spec, _math_answer(field)
    if spec == "digits":
        return spec, _digits(field, tokens)
    if ":" not in spec:
        raise DataError(f"task.reward={spec!r}: not a built-in ({', '.join(BUILTIN)}) and not "
                        f"'file.py:function' or 'module:function'")
    func = load_user_object(spec, "task.reward", "function")
    if not callable(func):
        raise DataError(f"task.reward={spec!r}: {spec.replace(':', '.')} is not callable")
    return spec, func
