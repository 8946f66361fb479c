"""Durable files of the run directory: atomic writes, fsync order, checksummed record files.

Contract
- `atomic_write(path, data)`: write `path.tmp`, fsync it, rename over `path`, fsync the directory.
  After it returns the new content survives a host crash; a crash before leaves the old content.
- `fsync_dir(path)`: make a directory's entries (renames, creations, removals) durable;
  `sync_files(paths)`: make files written with durable=False (and their directories) durable.
- `append_line(path, line)`: append one line and fsync it (and the directory when the file is
  new). A line cut by a crash is ended first, so it spoils only itself, never the next one.
- `write_record(path, payload, compress=0)` / `read_record(path)`: a record file is a 32-byte header
  (magic b"ARLREC\\0\\1", or b"ARLREC\\0\\2" when the stored bytes are the payload compressed with
  zstd at level `compress`; stored length u64, CRC32 of the stored bytes u32, CRC32 of the header's
  first 20 bytes u32, 8 zero bytes) then the stored bytes. `read_record` checks length and both
  checksums, decompresses, and raises `RecordError` (naming the file) on any mismatch: a damaged
  record never decodes into other bytes.
- `DiskFull`: an OSError with ENOSPC/EDQUOT raised by these writes, re-raised with the path named
  (`disk_full(exc, path)` converts one raised elsewhere; `str()` is the one line launch prints).
"""
from __future__ import annotations

import errno
import os
import struct
import zlib

MAGIC = b"ARLREC\x00\x01"
MAGIC_ZSTD = b"ARLREC\x00\x02"       # the stored bytes are a zstd frame of the payload
_HDR = struct.Struct("<8sQII8x")
HEADER_SIZE = _HDR.size
assert HEADER_SIZE == 32


class RecordError(ValueError):
    """A record file is truncated, damaged or not a record."""


class DiskFull(OSError):
    """No space left (or quota exceeded) while writing a file of the run directory."""

    def __str__(self) -> str:
        return f"no space left on device writing {self.filename}"


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: OSError, path: str) -> OSError:
    """`exc` as a DiskFull naming `path` when it is ENOSPC/EDQUOT; otherwise `exc` itself."""
    if is_disk_full(exc):
        return DiskFull(exc.errno, os.strerror(exc.errno), exc.filename or path)
    return exc


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, chunks, durable: bool) -> None:
    try:
        with open(path, "wb") as f:
            for c in chunks:
                f.write(c)
            if durable:
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise disk_full(exc, path) from None


def _replace(path: str, chunks, durable: bool) -> None:
    """Write `path.tmp`, rename it over `path`; with durable, fsync the file and the directory."""
    tmp = f"{path}.tmp"
    _write(tmp, chunks, durable)
    os.replace(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write(path: str, data: bytes, durable: bool = True) -> None:
    """Replace `path` with `data` atomically (and durably unless durable=False)."""
    _replace(path, (data,), durable)


def append_line(path: str, line: bytes) -> None:
    """Append `line` (newline added) to `path` durably (module docstring)."""
    new = not os.path.exists(path)
    try:
        with open(path, "ab+") as f:
            if not new and os.path.getsize(path):
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":         # a line cut by a crash: end it
                    f.write(b"\n")
            f.write(line.rstrip(b"\n") + b"\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise disk_full(exc, path) from None
    if new:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def record_header(payload, magic: bytes = MAGIC) -> bytes:
    crc = zlib.crc32(payload)
    head = struct.pack("<8sQI", magic, len(payload), crc)
    return _HDR.pack(magic, len(payload), crc, zlib.crc32(head))


def write_record(path: str, payload, durable: bool = True, compress: int = 0) -> None:
    """Atomically write one checksummed record file; durably unless durable=False (then the
    caller makes it durable later with `sync_files`, e.g. once per checkpoint). `compress`: a zstd
    level (1-22) to store the payload compressed; 0 stores it as is."""
    if compress:
        import zstandard
        payload = zstandard.ZstdCompressor(level=compress, threads=-1).compress(payload)  # all cores
        _replace(path, (record_header(payload, MAGIC_ZSTD), payload), durable)
    else:
        _replace(path, (record_header(payload), payload), durable)


def sync_files(paths) -> None:
    """fsync files written with durable=False, then their directories."""
    dirs = set()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dirs.add(os.path.dirname(os.path.abspath(path)))
    for d in dirs:
        fsync_dir(d)


def read_record(path: str) -> memoryview:
    """Payload of a record file (a read-only view, no copy); `RecordError` naming the file if it is damaged."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER_SIZE:
        raise RecordError(f"record file {path} is truncated ({len(data)} bytes)")
    magic, length, crc, hcrc = _HDR.unpack_from(data)
    if magic not in (MAGIC, MAGIC_ZSTD):
        raise RecordError(f"{path} is not a record file (bad magic)")
    if zlib.crc32(data[:20]) != hcrc or any(data[24:HEADER_SIZE]):
        raise RecordError(f"record file {path} has a damaged header")
    if len(data) - HEADER_SIZE != length:
        raise RecordError(f"record file {path} is truncated or padded: {len(data) - HEADER_SIZE} "
                          f"payload bytes, header says {length}")
    payload = memoryview(data)[HEADER_SIZE:]
    if zlib.crc32(payload) != crc:
        raise RecordError(f"record file {path} is damaged (payload checksum mismatch)")
    if magic == MAGIC_ZSTD:
        import zstandard
        try:
            return memoryview(zstandard.ZstdDecompressor().decompress(payload))
        except zstandard.ZstdError as exc:
            raise RecordError(f"record file {path}: its zstd payload does not decompress ({exc})") from None
    return payload
