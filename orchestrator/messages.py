"""Typed cross-process messages (the only control-plane wire format).

Small control messages are msgspec Structs in one tagged union, encoded with msgpack. Bulk data
(rollout groups, training batches) travels as `shm.codec.Sequences` records on their own rings.
Nothing on the wire is a free-form dict: stats are `dict[str, float]` by design (numbers only).
"""
from __future__ import annotations

from typing import Union

import msgspec


class Msg(msgspec.Struct, tag=True, array_like=True):
    pass


# supervisor -> inference worker (on the worker's request ring, in order with prompts)
class Generate(Msg):
    request_id: int
    prompt_id: int
    prompt_tokens: list[int]
    n: int
    max_new_tokens: int
    temperature: float
    eval: bool = False
    row: int = -1             # dataset row of the prompt (the reward reads it); -1: none (sim)
    # run.deterministic (loop.lockstep): the sampling key (row j samples from a generator keyed by
    # key + [j]; empty: the worker's own stream), and `hold`: more of this wave follows, do not
    # decode until a Generate without it arrived (so a wave's rows share forward passes as fixed)
    key: list[int] = msgspec.field(default_factory=list)
    hold: bool = False


class LoadWeights(Msg):
    version: int


class Abort(Msg):
    request_id: int


class Shutdown(Msg):
    reason: str = ""


# supervisor -> trainer
class SaveCheckpoint(Msg):
    step: int
    directory: str


class ReleaseWeights(Msg):
    """Every inference worker has loaded `version`: GPU buffers of older versions may be reused."""
    version: int


class LoadCheckpoint(Msg):
    directory: str
    version: int              # publish the loaded weights as this version


# worker -> supervisor (control ring)
class Ready(Msg):
    role: str
    index: int
    pid: int
    weight_nbytes: int


class WeightsLoaded(Msg):
    index: int
    version: int


class Aborted(Msg):
    """An inference worker handled `Abort(request_id)`. `result_sent`: the request had finished
    before (its result was emitted or will be, e.g. from the reward threads); False: it was stopped
    and nothing of it will ever be emitted."""
    index: int
    request_id: int
    result_sent: bool


class EnvHung(Msg):
    """An inference worker's environment hung on an episode of train row `row` (a blocking call
    abandoned past task.env_timeout_s, or the call that blocked its environment loop); `why`: the
    line naming the environment, the call and the row."""
    index: int
    row: int
    prompt_id: int
    why: str


class StepDone(Msg):
    step: int                 # 1-based trainer step just completed
    version: int              # policy version now published (== weights in the weight buffer)
    publish_time: float       # time.time() when the weights were published
    train_s: float
    stats: dict[str, float]


class CheckpointSaved(Msg):
    step: int
    directory: str


class Fatal(Msg):
    role: str
    index: int
    error: str                # one-line summary
    traceback: str


Message = Union[Generate, LoadWeights, Abort, Shutdown, SaveCheckpoint, LoadCheckpoint, ReleaseWeights, Ready,
                WeightsLoaded, Aborted, EnvHung, StepDone, CheckpointSaved, Fatal]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Msg) -> bytes:
    return _encoder.encode(msg)


def decode(buf) -> Message:
    try:
        return _decoder.decode(buf)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"malformed control message: {exc}") from None
