"""`sim` inference backend: no model, rollout latency drawn from a distribution.

Each request finishes `latency` seconds after it was added (fixed, uniform or lognormal; drawn by
`rollout_latency` from the run seed and the request id alone, so whichever worker serves a request
draws the same, and scripts/event_model.py replays the very latencies of a run's admissions). Its
completion tokens are spread evenly over that interval and each is stamped with the policy version
this backend had loaded at that instant, so a rollout that straddles a weight reload spans versions
exactly as a real partial rollout does. Rewards are Bernoulli(reward_p) per sample. Tokens,
logprobs and rewards come from the backend's stream, or for a keyed request (run.deterministic)
from a generator keyed by `req.key` alone. Every reload checks that the weight buffer holds the
bytes the sim trainer wrote for that version, so the whole weight path is verified end to end.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import time
from typing import Optional

import numpy as np

from orchestrator.backends.base import GenRequest, GenResult
from orchestrator.config import SimInferenceConfig
from shm.codec import Sequences

SIM_VOCAB = 1000


def rollout_latency(cfg: SimInferenceConfig, seed: int, request_id: int) -> float:
    """The latency of request `request_id` in a run seeded `seed`: a function of the two alone."""
    if cfg.latency == "fixed":
        return cfg.latency_s
    rng = np.random.default_rng([seed, request_id])
    if cfg.latency == "uniform":
        return float(rng.uniform(cfg.latency_low_s, cfg.latency_high_s))
    mu = np.log(cfg.latency_s) - cfg.lognormal_sigma ** 2 / 2    # mean == latency_s
    return float(rng.lognormal(mu, cfg.lognormal_sigma))


class SimInference:
    fills_rewards = True

    def __init__(self, cfg: SimInferenceConfig, seed: int, weight_bytes: int = 0, clock=time.monotonic,
                 latency_seed: int = 0):
        self.cfg = cfg
        self.latency_seed = latency_seed
        self.weight_bytes = weight_bytes
        self.rng = np.random.default_rng(seed)
        self.clock = clock
        self.version = 0
        self._loads_t: list[float] = [float("-inf")]   # reload history: times and versions
        self._loads_v: list[int] = [0]
        self._heap: list[tuple[float, int, float, GenRequest]] = []
        self._tie = itertools.count()
        self._produced = 0

    def add(self, req: GenRequest) -> None:
        now = self.clock()
        latency = rollout_latency(self.cfg, self.latency_seed, req.request_id)
        heapq.heappush(self._heap, (now + latency, next(self._tie), now, req))

    def num_active(self) -> int:
        return len(self._heap)

    def wait_hint(self) -> Optional[float]:
        if not self._heap:
            return None
        return max(0.0, self._heap[0][0] - self.clock())

    def abort(self, request_id: int) -> bool:
        keep = [e for e in self._heap if e[3].request_id != request_id]
        found = len(keep) != len(self._heap)
        self._heap = keep
        heapq.heapify(self._heap)
        return found

    def load_weights(self, version: int, flat: memoryview) -> None:
        if self.cfg.reload_delay_s:
            time.sleep(self.cfg.reload_delay_s)
        words = np.frombuffer(flat, dtype=np.int64, count=len(flat) // 8)
        if words.size and not (words == version).all():   # the sim trainer writes its version
            bad = int(np.flatnonzero(words != version)[0])
            raise RuntimeError(f"weight buffer content is not version {version}: word {bad} "
                               f"holds {int(words[bad])}")
        self.version = version
        self._loads_t.append(self.clock())
        self._loads_v.append(version)

    def weight_nbytes(self) -> int:
        return self.weight_bytes

    def _version_at(self, t: float) -> int:
        return self._loads_v[bisect.bisect_right(self._loads_t, t) - 1]

    def _result(self, start: float, finish: float, req: GenRequest) -> GenResult:
        n_new = min(self.cfg.completion_tokens, req.max_new_tokens)
        p = len(req.prompt_tokens)
        length = p + n_new
        gen_times = start + (finish - start) * np.arange(n_new) / n_new
        gen_versions = np.array([self._version_at(t) for t in gen_times], dtype=np.int32)
        tokens, logprobs, versions, mask = [], [], [], []
        rng = np.random.default_rng(list(req.key)) if req.key else self.rng
        for _ in range(req.n):
            tokens.append(np.concatenate([req.prompt_tokens.astype(np.int32),
                                          rng.integers(0, SIM_VOCAB, n_new, dtype=np.int32)]))
            logprobs.append(np.concatenate([np.zeros(p, np.float32),
                                            -rng.exponential(1.0, n_new).astype(np.float32)]))
            versions.append(np.concatenate([np.full(p, -1, np.int32), gen_versions]))
            mask.append(np.concatenate([np.zeros(p, np.uint8), np.ones(n_new, np.uint8)]))
        rewards = (rng.random(req.n) < self.cfg.reward_p).astype(np.float32)
        self._produced += 1
        if self._produced == self.cfg.nan_reward_after:
            rewards[0] = np.nan                       # fault injection: a broken environment
        seqs = Sequences(
            kind=0, ident=req.request_id, version=-1,
            offsets=np.arange(req.n + 1, dtype=np.int64) * length,
            prompt_lens=np.full(req.n, p, np.int32),
            prompt_ids=np.full(req.n, req.prompt_id, np.int64),
            tokens=np.concatenate(tokens), logprobs=np.concatenate(logprobs),
            versions=np.concatenate(versions), loss_mask=np.concatenate(mask),
            rewards=rewards, advantages=np.zeros(req.n, np.float32),
            scalars=np.zeros(0, np.float64))
        return GenResult(request_id=req.request_id, sequences=seqs)

    def step(self, max_wait_s: float = 0.0) -> list[GenResult]:
        wait = self.wait_hint()
        if wait is not None and 0 < wait <= max_wait_s:
            time.sleep(wait)
        now = self.clock()
        out = []
        while self._heap and self._heap[0][0] <= now:
            finish, _, start, req = heapq.heappop(self._heap)
            out.append(self._result(start, finish, req))
        if out and not self._heap:   # forget reload history nobody can reference any more
            self._loads_t, self._loads_v = [float("-inf")], [self.version]
        return out

    def close(self) -> None:
        self._heap.clear()
