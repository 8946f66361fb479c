"""A zero-overhead event model of the async pipeline, driving the real `StalenessGate`: the
baseline `bench_pipeline.py` divides the measured throughput by ("async / ideal").

    from scripts.event_model import simulate
    simulate(S=2, B=8, C=64, latency_s=0.1, sigma=1.0, step_time_s=0.1, steps=40)

Continuous time, no cost for anything but rollout latency and trainer steps: a prompt is admitted
the instant the gate has capacity and the run still needs it (the real loop's rule), generates for
the latency the sim backend gives the same request of a run seeded `seed` (its k-th admission is
request k + 1: `sim_inference.rollout_latency`; fixed, or lognormal with mean `latency_s` and
`sigma`), so a real sim run and the model see the very same latencies, and is accepted when it finishes; every B accepted rollouts make a batch (version = its step - 1);
the trainer takes one batch at a time (the ship hold) for `step_time_s`; its weights reach every
worker the instant it finishes. Returns the step completion times and the head age of every
trained rollout (its version at admission, the oldest its tokens can be).
"""
from __future__ import annotations

import heapq
import sys
from dataclasses import dataclass
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from orchestrator.backends.sim_inference import rollout_latency  # noqa: E402
from orchestrator.config import SimInferenceConfig  # noqa: E402
from orchestrator.loop.gate import StalenessGate  # noqa: E402


@dataclass
class Result:
    step_times: list[float]
    ages: list[int]

    def steps_per_s(self, skip_frac: float = 0.25) -> float:
        """Throughput over the same window bench_pipeline measures (the first quarter skipped)."""
        warm = self.step_times[int(len(self.step_times) * skip_frac):]
        return (len(warm) - 1) / (warm[-1] - warm[0])


def simulate(S: int, B: int, C: int, latency_s: float, sigma: float | None, step_time_s: float,
             steps: int, seed: int = 0) -> Result:
    sim = (SimInferenceConfig(latency="lognormal", latency_s=latency_s, lognormal_sigma=sigma)
           if sigma else SimInferenceConfig(latency="fixed", latency_s=latency_s))
    admitted = 0
    version = [0]
    gate = StalenessGate(S, B, C, version=lambda: version[0])
    t, events, tie = 0.0, [], 0           # (time, tie, kind, payload)
    sink: list[int] = []                  # head versions of finished rollouts
    parked: list[list[int]] = []          # built batches: head versions of their rollouts
    trainer_free, built = True, 0
    step_times: list[float] = []
    ages: list[int] = []

    def latency() -> float:
        nonlocal admitted
        admitted += 1                      # request ids start at 1, in admission order
        return rollout_latency(sim, seed, admitted)

    def push(when: float, kind: str, payload) -> None:
        nonlocal tie
        heapq.heappush(events, (when, tie, kind, payload))
        tie += 1

    while len(step_times) < steps:
        while True:                        # admit: the gate's capacity and the run's need
            st = gate.stats()
            if gate.capacity() <= 0 or st["accepted"] + st["running"] >= steps * B:
                break
            gate.on_enqueued()
            gate.on_submitted()
            push(t + latency(), "done", version[0])
        while len(sink) >= B:              # batches in completion order
            parked.append(sink[:B])
            del sink[:B]
            built += 1
        if trainer_free and parked:        # the ship hold: one batch at the trainer
            batch = parked.pop(0)
            trainer_free = False
            push(t + step_time_s, "trained", (len(step_times), batch))
            continue
        t, _, kind, payload = heapq.heappop(events)
        if kind == "done":
            gate.on_accepted()
            sink.append(payload)
        else:
            step, batch = payload
            ages.extend(step - head for head in batch)     # batch k trains at version k - 1
            version[0] += 1
            step_times.append(t)
            trainer_free = True
    return Result(step_times, ages)
