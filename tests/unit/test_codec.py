"""shm.codec: round-trips, concat, encode-side validation, and a decode fuzz (corrupt, truncated,
bit-flipped or re-headered records raise CodecError or decode to a valid record inside the buffer)."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shm import codec
from shm.codec import CodecError, Sequences, concat, decode, encode, encode_into, encoded_size


def make(rng: np.random.Generator, n: int, max_len: int = 12, k: int = 2, kind: int = 1) -> Sequences:
    lens = rng.integers(0, max_len + 1, n)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    T = int(offsets[-1])
    return Sequences(
        kind=kind, ident=int(rng.integers(-(2**40), 2**40)), version=int(rng.integers(-1, 100)),
        offsets=offsets, prompt_lens=(rng.random(n) * (lens + 1)).astype(np.int32),
        prompt_ids=rng.integers(0, 2**40, n), tokens=rng.integers(0, 50000, T).astype(np.int32),
        logprobs=-rng.random(T).astype(np.float32), versions=rng.integers(-1, 9, T).astype(np.int32),
        loss_mask=rng.integers(0, 2, T).astype(np.uint8), rewards=rng.random(n).astype(np.float32),
        advantages=rng.standard_normal(n).astype(np.float32), scalars=rng.random(k))


@given(st.integers(0, 2**32 - 1), st.integers(0, 20), st.integers(0, 64))
@settings(max_examples=60, deadline=None)
def test_roundtrip(seed, n, k):
    s = make(np.random.default_rng(seed), n, k=k)
    buf = encode(s)
    assert len(buf) == encoded_size(s) and len(buf) % 64 == 0
    d = decode(bytes(buf))
    assert d == s and d.n == n
    for i in range(n):
        assert d.tokens[d.seq(i)].tolist() == s.tokens[s.offsets[i]:s.offsets[i + 1]].tolist()
    for name, dt, _ in codec._FIELDS:                 # wire dtypes
        assert getattr(d, name).dtype == dt


def test_decode_is_zero_copy_and_aligned():
    s = make(np.random.default_rng(0), 5)
    buf = encode(s)
    d = decode(buf)
    base = np.frombuffer(buf, np.uint8).ctypes.data
    for name, _, _ in codec._FIELDS:
        assert (getattr(d, name).ctypes.data - base) % 64 == 0
    d.tokens[0] = 12345                              # a view: writes land in buf
    assert decode(buf).tokens[0] == 12345
    assert not decode(bytes(buf)).tokens.flags.writeable


def test_encode_into_larger_buffer_and_empty():
    s = make(np.random.default_rng(1), 3)
    big = bytearray(encoded_size(s) + 100)
    size = encode_into(s, big)
    assert decode(memoryview(big)[:size]) == s
    with pytest.raises(CodecError, match="oversized"):
        decode(big)
    empty = concat([], kind=0, ident=0, version=-1)
    assert decode(encode(empty)) == empty and empty.n == 0


def test_concat_rebases_offsets():
    rng = np.random.default_rng(2)
    parts = [make(rng, 3), make(rng, 0), make(rng, 4)]
    batch = concat(parts, kind=2, ident=17, version=5)
    assert batch.n == 7 and (batch.kind, batch.ident, batch.version) == (2, 17, 5)
    assert decode(encode(batch)) == batch
    for j, (p, i) in enumerate([(p, i) for p in parts for i in range(p.n)]):
        assert batch.tokens[batch.seq(j)].tolist() == p.tokens[p.seq(i)].tolist()
        assert batch.prompt_lens[j] == p.prompt_lens[i] and batch.rewards[j] == p.rewards[i]


def test_build_helper():
    s = Sequences.build(1, 9, 3, [dict(prompt=[5, 6], completion=[7], logprobs=[-0.5], reward=1.0,
                                        prompt_id=4)])
    assert s.tokens.tolist() == [5, 6, 7] and s.loss_mask.tolist() == [0, 0, 1]
    assert s.versions.tolist() == [-1, -1, 3] and s.logprobs.tolist() == [0, 0, -0.5]
    assert decode(encode(s)) == s


@pytest.mark.parametrize("field,value,msg", [
    ("offsets", np.array([0, 4, 3]), "decrease"),
    ("offsets", np.array([1, 2, 3]), "offsets\\[0\\]"),
    ("prompt_lens", np.array([4, 0], np.int32), "prompt_lens"),
    ("prompt_lens", np.array([-1, 0], np.int32), "prompt_lens"),
    ("tokens", np.zeros(2, np.int32), "entries"),
    ("offsets", np.array([0, 3, 2]), "T=3"),
    ("rewards", np.zeros(3, np.float32), "rewards"),
    ("scalars", np.zeros(65), "scalars"),
    ("tokens", np.full(3, 2**40), "fit"),
    ("kind", -1, "kind"),
])
def test_encode_rejects_inconsistent(field, value, msg):
    s = Sequences.build(0, 0, 0, [dict(prompt=[1], completion=[2, 3]), dict(prompt=[], completion=[])])
    setattr(s, field, value)
    with pytest.raises(CodecError, match=msg):
        encode(s)


# ---- decode fuzz ----------------------------------------------------------------------------
_VALID = [encode(make(np.random.default_rng(i), n, k=k))
          for i, (n, k) in enumerate([(0, 0), (1, 1), (3, 0), (7, 5)])]


def _check_decoded(buf: bytes) -> None:
    try:
        d = decode(buf)
    except CodecError:
        return
    lo = np.frombuffer(buf, np.uint8).ctypes.data
    for name, _, _ in codec._FIELDS:
        arr = getattr(d, name)
        assert lo <= arr.ctypes.data and arr.ctypes.data + arr.nbytes <= lo + len(buf), name
    assert decode(encode(d)) == d                  # a valid record in every respect


def _reheader(buf: bytes, **fields) -> bytes:
    names = ["magic", "fmt", "hsize", "kind", "k", "ident", "version", "n", "T", "total", "crc", "pad"]
    vals = dict(zip(names, codec._HDR.unpack_from(buf)))
    vals.update(fields)
    hdr = bytearray(codec._HDR.pack(*[vals[x] for x in names]))
    struct.pack_into("<I", hdr, 56, codec._crc(hdr))
    return bytes(hdr) + buf[64:]


@given(st.sampled_from(_VALID), st.data())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_bitflips_and_truncation(valid, data):
    buf = bytearray(valid)
    for pos in data.draw(st.lists(st.integers(0, len(buf) * 8 - 1), max_size=6)):
        buf[pos // 8] ^= 1 << (pos % 8)
    cut = data.draw(st.integers(0, len(buf)))
    _check_decoded(bytes(buf[:cut]) + data.draw(st.binary(max_size=80)))


@given(st.sampled_from(_VALID), st.integers(0, 2**32 - 1), st.integers(0, 64), st.integers(-2**63, 2**63 - 1),
       st.integers(-2**63, 2**63 - 1), st.integers(-2**63, 2**63 - 1), st.booleans())
@settings(max_examples=400, deadline=None)
def test_fuzz_consistent_crc_wrong_counts(valid, kind, k, n, T, total, small):
    if small:                                        # near-valid values reach the column checks
        n, T, total = abs(n) % 12, abs(T) % 80, len(valid)
    _check_decoded(_reheader(bytes(valid), kind=kind, k=k, n=n, T=T, total=total))


@given(st.sampled_from(_VALID[2:]), st.data())
@settings(max_examples=200, deadline=None)
def test_fuzz_column_values(valid, data):
    buf = bytearray(valid)
    d = decode(buf)                                  # writable views into buf
    arr = getattr(d, data.draw(st.sampled_from(["offsets", "prompt_lens"])))
    arr[data.draw(st.integers(0, len(arr) - 1))] = data.draw(st.integers(-2**31, 2**31 - 1))
    _check_decoded(bytes(buf))


def test_decode_rejects_garbage_types_and_headers():
    for bad in (b"", b"x" * 63, b"ARLQ" + bytes(60), bytes(_VALID[1])[:-64]):
        with pytest.raises(CodecError):
            decode(bad)
    with pytest.raises(CodecError, match="not a buffer"):
        decode(12)
    with pytest.raises(CodecError, match="checksum"):
        b = bytearray(_VALID[1])
        b[20] ^= 1
        decode(b)
    with pytest.raises(CodecError, match="format"):
        decode(_reheader(bytes(_VALID[1]), fmt=2))
