"""pass@k: the probability that at least one of k samples of a prompt is correct, estimated without
bias from n >= k samples of which c are correct (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code"): 1 - C(n - c, k) / C(n, k).

Contract: `pass_at_k(n, c, k) -> float` for integers 1 <= k <= n and 0 <= c <= n (a ValueError
naming the argument otherwise); 1.0 when n - c < k (every k-subset holds a correct sample). It is
computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i), a product of c factors in (0, 1], never a ratio
of binomials, so it is exact to float rounding for any n (C(n, k) overflows floats from n ~ 1030).
numpy only, like the rest of the supervisor's side of orchestrator.algo.
"""
from __future__ import annotations

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"pass_at_k: {name} must be an integer, got {v!r}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in 1..n={n}, got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in 0..n={n}, got {c}")
    if n - c < k:
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))
