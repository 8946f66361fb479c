"""Backend protocols: what an inference worker and the trainer worker drive.

An inference backend is stepped by its worker's main loop (poll control -> step -> emit). Generated
tokens are stamped with the policy version the backend had loaded when it produced them, so one
rollout can span versions (weights reload between decode steps). A trainer backend takes one
columnar batch (`shm.codec.Sequences`) per step and exposes its weights as one flat byte buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np

from shm.codec import Sequences


@dataclass
class GenRequest:
    request_id: int            # supervisor-assigned, unique per run
    prompt_id: int             # index into the task's prompt set (train or eval)
    prompt_tokens: np.ndarray  # int32 [P]
    n: int                     # samples to generate for this prompt (GRPO group size)
    max_new_tokens: int
    temperature: float
    eval: bool = False
    key: tuple = ()            # run.deterministic: row j samples from a generator keyed by key + (j,)


@dataclass
class GenResult:
    request_id: int
    # n sequences, each prompt + completion tokens; per-token logprobs (0 on prompt tokens),
    # versions (-1 on prompt tokens), loss_mask (1 on generated tokens). rewards filled by the worker.
    sequences: Sequences


class InferenceBackend(Protocol):
    def add(self, req: GenRequest) -> None: ...
    def step(self, max_wait_s: float) -> list[GenResult]:
        """Do at most one unit of work (one decode step for all active sequences; for sim, wait up to
        max_wait_s for the next completion) and return the requests that finished."""
    def num_active(self) -> int: ...
    # optional: `wait_hint() -> float | None`, seconds until the backend has work to do (None: idle);
    # without it the worker polls for requests only while nothing is active
    def abort(self, request_id: int) -> bool: ...
    def load_weights(self, version: int, flat: memoryview) -> None:
        """Install new weights between decode steps; later tokens are stamped with `version`.
        `flat` may be read-only and is only valid during the call."""
    # optional: `weights_in_place: memoryview | None`, a writable buffer the backend's weights live
    # in (the flat layout): the worker reads into it, then calls load_weights(version, it)
    def weight_nbytes(self) -> int: ...
    def close(self) -> None: ...


class TrainerBackend(Protocol):
    def train_step(self, batch: Sequences) -> dict[str, float]:
        """One optimizer step on a batch (advantages per sequence, loss_mask per token)."""
    def weight_nbytes(self) -> int: ...
    def write_weights(self, out: memoryview) -> None:
        """Copy the current weights into `out` (len == weight_nbytes()) in the layout inference loads."""
    def save(self, directory: str) -> None: ...
    def load(self, directory: str) -> None: ...
    def close(self) -> None: ...


class Task(Protocol):
    """A prompt source (orchestrator.data.workload.build_task): the supervisor admits its prompts; the
    inference worker's reward pool scores completions against the dataset row a prompt names."""
    max_prompt_tokens: int
    filtered: int
    identity: Optional[dict]      # what a checkpoint records of the prompts (None: from config)

    def train_prompt(self, index: int) -> tuple[int, np.ndarray, int]:
        """(prompt id, int32 token ids, dataset row or -1) of stream index `index`."""
    def eval_prompts(self) -> list[tuple[int, np.ndarray, int]]: ...
    @property
    def num_train(self) -> int: ...
