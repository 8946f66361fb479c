"""Record files, plain and zstd-compressed: every single-byte change and every truncation is
detected, never decoded; a compressed one is smaller and reads back the same bytes."""
import os

import numpy as np
import pytest

from orchestrator.run.durable import HEADER_SIZE, RecordError, atomic_write, read_record, write_record
from shm.codec import Sequences, decode, encode


def _record():
    rng = np.random.default_rng(0)
    seqs = [{"prompt": rng.integers(0, 50, 5).tolist(), "completion": rng.integers(0, 50, 7).tolist(),
             "logprobs": -rng.random(7), "reward": float(i), "prompt_id": i} for i in range(4)]
    return bytes(encode(Sequences.build(2, 3, 2, seqs)))


@pytest.mark.parametrize("level", [0, 3])
def test_round_trip_and_every_altered_byte_is_caught(tmp_path, level):
    payload = _record()
    path = str(tmp_path / "r.rec")
    write_record(path, payload, compress=level)
    assert bytes(read_record(path)) == payload and decode(read_record(path)) == decode(payload)
    good = open(path, "rb").read()
    assert (len(good) < len(payload)) == bool(level) and good[6:8] == (b"\0\2" if level else b"\0\1")
    assert not os.path.exists(path + ".tmp")
    for offset in range(0, len(good), 7):
        bad = bytearray(good)
        bad[offset] ^= 0x01
        open(path, "wb").write(bad)
        with pytest.raises(RecordError):
            read_record(path)
    for cut in (0, HEADER_SIZE - 1, HEADER_SIZE, len(good) - 1):
        open(path, "wb").write(good[:cut])
        with pytest.raises(RecordError):
            read_record(path)


def test_atomic_write_replaces_whole_content(tmp_path):
    path = str(tmp_path / "f")
    atomic_write(path, b"old")
    atomic_write(path, b"new content")
    assert open(path, "rb").read() == b"new content" and not os.path.exists(path + ".tmp")
