"""Typed zero-copy codec for columnar sequence records (`Sequences`).

Contract
- `encode(s)` -> one contiguous record: a 64-byte header then every array, each starting at a
  64-byte aligned offset, little-endian, in the fixed order of `_FIELDS`. `encode_into(s, buf)`
  writes the same bytes into a writable buffer (e.g. straight into a ring slot via Ring.put_from).
  `encoded_size(s)` is its size; `record_size(n, T, k)` the size of any record of n sequences, T
  tokens and k scalars (e.g. the largest record a config can produce, to size rings).
- `decode(buf)` returns a `Sequences` whose arrays are numpy views into `buf` (read-only when buf
  is). `buf` must be exactly one record. It validates magic, format version, header CRC32, every
  length against the buffer size, offsets (start 0, non-decreasing, end T), prompt_lens bounds and
  the scalar count, and raises `CodecError` (a ValueError) with a clear message otherwise. It never
  builds a view past the end of `buf`.
- `concat(parts, kind, ident, version)` joins groups into one batch (offsets rebased).
Header: magic b"ARLQ", format u16, header size u16, kind u32, k u32, ident i64, version i64,
n i64, T i64, total bytes i64, crc32 u32 (of the header with this field zeroed), pad u32.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, fields

import numpy as np

__all__ = ["Sequences", "CodecError", "encode", "encode_into", "encoded_size", "record_size", "decode",
           "concat"]

MAGIC = b"ARLQ"
FORMAT_VERSION = 1
_HDR = struct.Struct("<4sHHIIqqqqqII")
HEADER_SIZE = 64
MAX_SCALARS = 64
_ALIGN = 64
_I64_MAX = (1 << 63) - 1
_U32_MAX = (1 << 32) - 1
assert _HDR.size == HEADER_SIZE

# (field, dtype, length: "n" | "n1" (n+1) | "T" | "k")
_FIELDS = (
    ("offsets", np.dtype("<i8"), "n1"),
    ("prompt_lens", np.dtype("<i4"), "n"),
    ("prompt_ids", np.dtype("<i8"), "n"),
    ("tokens", np.dtype("<i4"), "T"),
    ("logprobs", np.dtype("<f4"), "T"),
    ("versions", np.dtype("<i4"), "T"),
    ("loss_mask", np.dtype("u1"), "T"),
    ("rewards", np.dtype("<f4"), "n"),
    ("advantages", np.dtype("<f4"), "n"),
    ("scalars", np.dtype("<f8"), "k"),
)


class CodecError(ValueError):
    """A record is corrupt, truncated or inconsistent (or a Sequences cannot be encoded)."""


@dataclass(eq=False)
class Sequences:
    """n sequences, columnar. A rollout group (inference -> supervisor) or a train batch
    (supervisor -> trainer)."""
    kind: int              # small non-negative int chosen by the caller
    ident: int             # request id (group) or step (batch); int64
    version: int           # int64; -1 when not applicable
    offsets: np.ndarray    # int64 [n+1], offsets[0]==0, non-decreasing, offsets[-1]==T
    prompt_lens: np.ndarray   # int32 [n]; 0 <= prompt_lens[i] <= len(seq i)
    prompt_ids: np.ndarray    # int64 [n]
    tokens: np.ndarray     # int32 [T]
    logprobs: np.ndarray   # float32 [T]  behaviour logprob of each token (0 for prompt tokens)
    versions: np.ndarray   # int32 [T]    policy version that generated each token; -1 = not live
    loss_mask: np.ndarray  # uint8 [T]
    rewards: np.ndarray    # float32 [n]
    advantages: np.ndarray # float32 [n]
    scalars: np.ndarray    # float64 [k], k <= 64, free per-record scalars

    @property
    def n(self) -> int:
        return len(self.offsets) - 1

    @property
    def T(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0

    def seq(self, i) -> slice:
        """Token slice of sequence i."""
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequences):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    @classmethod
    def build(cls, kind: int, ident: int, version: int, seqs: list[dict], scalars=()) -> "Sequences":
        """From per-sequence dicts: prompt (ids), completion (ids), logprobs and versions of the
        completion (versions may be one int), reward, prompt_id, advantage (default 0). Prompt tokens
        get logprob 0, version -1 and loss_mask 0; completion tokens loss_mask 1."""
        lens = [len(d["prompt"]) + len(d["completion"]) for d in seqs]
        offsets = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        T = int(offsets[-1])
        tokens, logprobs = np.zeros(T, np.int32), np.zeros(T, np.float32)
        versions, mask = np.full(T, -1, np.int32), np.zeros(T, np.uint8)
        for i, d in enumerate(seqs):
            a, p, c = int(offsets[i]), len(d["prompt"]), len(d["completion"])
            tokens[a:a + p] = d["prompt"]
            tokens[a + p:a + p + c] = d["completion"]
            logprobs[a + p:a + p + c] = d.get("logprobs", 0.0)
            versions[a + p:a + p + c] = d.get("versions", version)
            mask[a + p:a + p + c] = 1
        return cls(kind, ident, version, offsets,
                   np.array([len(d["prompt"]) for d in seqs], np.int32),
                   np.array([d.get("prompt_id", 0) for d in seqs], np.int64), tokens, logprobs,
                   versions, mask, np.array([d.get("reward", 0.0) for d in seqs], np.float32),
                   np.array([d.get("advantage", 0.0) for d in seqs], np.float32),
                   np.asarray(scalars, np.float64))


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return a == b


def _align(x: int) -> int:
    return (x + _ALIGN - 1) & ~(_ALIGN - 1)


def _layout(n: int, T: int, k: int) -> tuple[list[int], int]:
    """Byte offset of each field and the total record size."""
    counts = {"n": n, "n1": n + 1, "T": T, "k": k}
    offs, at = [], HEADER_SIZE
    for _name, dt, length in _FIELDS:
        offs.append(at)
        at = _align(at + counts[length] * dt.itemsize)
    return offs, at


def _crc(header: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(bytes(header[:56]) + bytes(header[60:64]))


def _check_columns(n: int, T: int, offsets, prompt_lens) -> None:
    if offsets[0] != 0:
        raise CodecError(f"offsets[0] is {offsets[0]}, expected 0")
    if offsets[n] != T:
        raise CodecError(f"offsets[-1] is {offsets[n]}, expected T={T}")
    lens = np.diff(offsets)
    if n and lens.min() < 0:
        raise CodecError(f"offsets decrease at sequence {int(np.argmax(lens < 0))}")
    if n and (prompt_lens.min() < 0 or (prompt_lens > lens).any()):
        bad = int(np.argmax((prompt_lens < 0) | (prompt_lens > lens)))
        raise CodecError(f"prompt_lens[{bad}]={prompt_lens[bad]} outside [0, {lens[bad]}]")


def _coerce(s: Sequences) -> tuple[int, int, int, list[np.ndarray]]:
    """Validate `s` and return (n, T, k, arrays in _FIELDS order with the wire dtypes)."""
    if not 0 <= s.kind <= _U32_MAX:
        raise CodecError(f"kind must be in [0, 2**32), got {s.kind}")
    for name in ("ident", "version"):
        if not -_I64_MAX - 1 <= getattr(s, name) <= _I64_MAX:
            raise CodecError(f"{name} does not fit int64: {getattr(s, name)}")
    arrays = []
    for name, dt, _length in _FIELDS:
        a = np.asarray(getattr(s, name))
        if a.ndim != 1:
            raise CodecError(f"{name} must be 1-D, got shape {a.shape}")
        if a.dtype != dt:
            if a.size and a.dtype.kind in "iub" and dt.kind in "iu":
                info = np.iinfo(dt)
                if a.min() < info.min or a.max() > info.max:
                    raise CodecError(f"{name} values do not fit {dt}")
            elif not np.can_cast(a.dtype, dt, "same_kind"):
                raise CodecError(f"{name} has dtype {a.dtype}, cannot encode as {dt}")
            a = a.astype(dt)
        arrays.append(np.ascontiguousarray(a))
    n, T, k = len(arrays[0]) - 1, len(arrays[3]), len(arrays[9])
    if n < 0:
        raise CodecError("offsets must have n+1 >= 1 entries")
    if k > MAX_SCALARS:
        raise CodecError(f"at most {MAX_SCALARS} scalars, got {k}")
    counts = {"n": n, "n1": n + 1, "T": T, "k": k}
    for (name, _dt, length), a in zip(_FIELDS, arrays):
        if len(a) != counts[length]:
            raise CodecError(f"{name} has {len(a)} entries, expected {counts[length]} ({length})")
    _check_columns(n, T, arrays[0], arrays[1])
    return n, T, k, arrays


def record_size(n: int, T: int, k: int = 0) -> int:
    """Bytes of the record of n sequences holding T tokens in all and k scalars."""
    return _layout(n, T, k)[1]


def encoded_size(s: Sequences) -> int:
    return record_size(len(s.offsets) - 1, len(s.tokens), len(s.scalars))


def encode_into(s: Sequences, buf) -> int:
    """Write the record for `s` at the start of the writable buffer `buf`; return its size."""
    n, T, k, arrays = _coerce(s)
    offs, total = _layout(n, T, k)
    out = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    if out.readonly:
        raise CodecError("encode_into needs a writable buffer")
    if len(out) < total:
        raise CodecError(f"buffer of {len(out)} bytes is too small for a {total}-byte record")
    ends = []
    for off, a in zip(offs, arrays):
        nb = a.nbytes
        out[off:off + nb] = a.view(np.uint8).reshape(-1) if nb else b""
        ends.append(off + nb)
    for end, nxt in zip(ends, offs[1:] + [total]):
        out[end:nxt] = bytes(nxt - end)                   # deterministic padding
    hdr = bytearray(_HDR.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, s.kind, k, s.ident, s.version,
                              n, T, total, 0, 0))
    struct.pack_into("<I", hdr, 56, _crc(hdr))
    out[0:HEADER_SIZE] = hdr
    return total


def encode(s: Sequences) -> bytearray:
    buf = bytearray(encoded_size(s))
    encode_into(s, buf)
    return buf


def decode(buf) -> Sequences:
    """Validate one record and return a Sequences of numpy views into `buf` (zero-copy)."""
    try:
        mv = memoryview(buf)
    except TypeError:
        raise CodecError(f"cannot decode a {type(buf).__name__}: not a buffer") from None
    if mv.ndim != 1 or mv.format != "B":
        if not mv.c_contiguous:
            raise CodecError("record buffer must be C-contiguous")
        mv = mv.cast("B")
    size = len(mv)
    if size < HEADER_SIZE:
        raise CodecError(f"truncated record: {size} bytes, header needs {HEADER_SIZE}")
    magic, fmt, hsize, kind, k, ident, version, n, T, total, crc, _pad = _HDR.unpack_from(mv, 0)
    if magic != MAGIC:
        raise CodecError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if fmt != FORMAT_VERSION or hsize != HEADER_SIZE:
        raise CodecError(f"unsupported format {fmt} (header {hsize}), "
                         f"expected {FORMAT_VERSION} ({HEADER_SIZE})")
    if crc != _crc(mv[:HEADER_SIZE]):
        raise CodecError("header checksum mismatch")
    if n < 0 or T < 0 or not 0 <= k <= MAX_SCALARS:
        raise CodecError(f"bad counts n={n} T={T} k={k}")
    if n > size or T > size:                              # cheap bound before computing the layout
        raise CodecError(f"counts n={n} T={T} exceed the {size}-byte buffer")
    offs, need = _layout(n, T, k)
    if total != need:
        raise CodecError(f"header says {total} bytes but n={n} T={T} k={k} need {need}")
    if size != total:
        what = "truncated" if size < total else "oversized"
        raise CodecError(f"{what} record: {size} bytes, expected {total}")
    counts = {"n": n, "n1": n + 1, "T": T, "k": k}
    arrays = [np.frombuffer(mv, dt, counts[length], off) for (_n, dt, length), off in zip(_FIELDS, offs)]
    _check_columns(n, T, arrays[0], arrays[1])
    return Sequences(kind, ident, version, *arrays)


def concat(parts: list[Sequences], kind: int, ident: int, version: int, scalars=()) -> Sequences:
    """Join groups into one Sequences (e.g. a train batch); per-record scalars are replaced by `scalars`."""
    if not parts:
        return Sequences(kind, ident, version, np.zeros(1, np.int64), *(
            np.zeros(0, dt) for name, dt, _l in _FIELDS[1:-1]), np.asarray(scalars, np.float64))
    offs, base = [np.zeros(1, np.int64)], 0
    for p in parts:
        o = np.asarray(p.offsets, np.int64)
        offs.append(o[1:] + base)
        base += int(o[-1])
    cols = {name: np.concatenate([np.asarray(getattr(p, name)) for p in parts]).astype(dt, copy=False)
            for name, dt, _l in _FIELDS[1:-1]}
    return Sequences(kind, ident, version, np.concatenate(offs), **cols,
                     scalars=np.asarray(scalars, np.float64))
