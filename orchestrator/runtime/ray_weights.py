"""Weights to an inference worker on another node (`placement.mode: ray`): a gloo pair per host.

A bridged host (`ray_host.WorkerHost` on another node than the supervisor's) gets each published
weights version over a torch.distributed gloo process group of two members made for it alone when
its worker starts: the sender (rank 0) in the supervisor's process on the driver's node, the host
actor (rank 1). No global `init_process_group`: the driver runs one `TCPStore` for the run
(`Rendezvous`, a free port; the store listens on every interface, torch offers no bind address for
it) and every pair meets there under a key of its own (`PrefixStore`); each side's gloo device is
bound to its node's IP as Ray reports it. One group per host, not one broadcast group over every
host: a dead or restarted host breaks only its own pair (a collective over every host fails for all
of them at one death), and a restarted worker gets a new pair, so a pair that failed mid-transfer is
never used again.

Why the sender sits on the driver's node and reads the slot trainer rank 0 published (the run's shm
weight buffer, `WeightBuffer.read_with`) rather than in trainer rank 0's process: the trainer's step
never waits on a remote node (a slow or dead host costs the pump's thread, not a training step), and
the supervisor, which owns restarts, owns the pairs too, so a host's death is handled where every
worker death is (`HostedWorker._dead`).

- `Rendezvous(ip, timeout_s)` (driver): the store (`.ip`, `.port`); `pair(key) -> WeightPair` makes
  rank 0 of the pair `key`, waiting at most `timeout_s` for the host to join.
- `join(ip, port, key, device_ip, timeout_s) -> WeightPair` (host): rank 1 of that pair.
- `WeightPair.send_latest(wbuf, min_version, bucket) -> (version, nbytes, buckets)` sends the latest
  version >= `min_version` of the weight buffer `wbuf` straight from its shm slot (`torch.frombuffer`
  over the `read_with` view: no copy), in buckets of `bucket` bytes.
- `WeightPair.recv_into(wbuf) -> version` receives one version straight into the free slot of the
  host's weight buffer (`publish_from`: no copy) and publishes it; it raises (`ChannelError`), never
  publishes wrong bytes.
- `close()`: shuts the group down (both sides; idempotent).

Wire, per version: one or more attempts, each a head (int64 [DATA, version, nbytes, bucket, n]),
the n buckets' CRC-32s (int64 [n], computed over the slot before any bucket goes), the n buckets,
then a trailer (int64 [DONE or AGAIN, version]). AGAIN: the trainer rewrote the slot while it was
being sent (the seqlock moved; read_with calls the sender again), so the receiver drops the attempt
and takes the next one (at most `MAX_ATTEMPTS`). DONE after a bucket whose bytes do not match its
CRC-32 is damage (in transit, or the slot written past its seqlock): `ChannelError`, nothing
published. Every gloo operation waits at most the pair's `timeout_s`; a peer that dies or stalls
makes the other side raise within it. The caller treats any failure as the host's death.
Not built: NCCL between GPUs (ray mode has no GPU inference workers yet: their weights would come
over this CPU pair and be loaded from CPU).
"""
from __future__ import annotations

import datetime
import warnings
import zlib

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroupGloo

from orchestrator.errors import ChannelError

DATA, DONE, AGAIN = 0x5747_0001, 0x5747_0002, 0x5747_0003
MAX_ATTEMPTS = 8          # a slot rewritten this often during one send: the link is too slow
SENDER, RECEIVER, TAG = 0, 1, 0
# torch.frombuffer warns over a read-only buffer (the published slot), which is only ever sent; a
# filter for that one message, set once (catch_warnings is not thread-safe: pumps are threads)
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


class Rendezvous:
    """The run's meeting point for gloo pairs: a TCPStore server on the driver's node."""

    def __init__(self, ip: str, timeout_s: float) -> None:
        self.ip, self.timeout_s = ip, timeout_s
        self.store = dist.TCPStore(ip, 0, None, True, _td(timeout_s), wait_for_workers=False)
        self.port = self.store.port

    def pair(self, key: str) -> "WeightPair":
        return WeightPair(self.store, key, SENDER, self.ip, self.timeout_s)


def join(ip: str, port: int, key: str, device_ip: str, timeout_s: float) -> "WeightPair":
    store = dist.TCPStore(ip, port, None, False, _td(timeout_s))
    return WeightPair(store, key, RECEIVER, device_ip, timeout_s)


class WeightPair:
    def __init__(self, store, key: str, rank: int, device_ip: str, timeout_s: float) -> None:
        opts = ProcessGroupGloo._Options()
        opts._timeout = _td(timeout_s)
        opts._devices = [ProcessGroupGloo.create_device(hostname=device_ip)]
        opts._threads = 1                   # collectives' threads: a pair only sends and receives
        self.key, self.rank, self.timeout_s = key, rank, timeout_s
        self._store = store
        self.pg = ProcessGroupGloo(dist.PrefixStore(f"arl-weights/{key}/", store), rank, 2, opts)
        self.peer = 1 - rank

    # ------------------------------------------------------------------ sender
    def send_latest(self, wbuf, min_version: int, bucket: int) -> tuple:
        """Send the latest version >= min_version of `wbuf`; (version, nbytes, buckets)."""
        if bucket < 1:
            raise ValueError(f"bucket must be >= 1 byte, got {bucket}")
        state = {"attempts": 0, "error": None, "sent": (0, 0)}

        def attempt(view: memoryview, version: int) -> None:
            if state["error"] is not None:
                return
            try:
                if state["attempts"]:                 # the previous attempt read a rewritten slot
                    self._send_ints([AGAIN, version])
                if state["attempts"] == MAX_ATTEMPTS:
                    raise ChannelError(f"weights over gloo: the slot was rewritten during "
                                       f"{MAX_ATTEMPTS} sends in a row (the trainer publishes "
                                       f"faster than this link carries a version)")
                state["attempts"] += 1
                state["sent"] = (len(view), self._send_view(view, version, bucket))
            except Exception as exc:                  # read_with would retry a torn slot's error
                state["error"] = exc

        version = wbuf.read_with(attempt, timeout=self.timeout_s, min_version=min_version)
        if state["error"] is not None:
            raise state["error"]
        self._send_ints([DONE, version])
        return (version, *state["sent"])

    def _send_view(self, view: memoryview, version: int, bucket: int) -> int:
        """One attempt: head, CRC-32s, buckets straight from `view`; the number of buckets."""
        nbytes = len(view)
        spans = [(a, min(a + bucket, nbytes)) for a in range(0, nbytes, bucket)]
        crcs = [zlib.crc32(view[a:b]) for a, b in spans]
        self._send_ints([DATA, version, nbytes, bucket, len(spans)])
        if spans:
            self._send_ints(crcs)
            flat = _tensor(view)
            works = [self.pg.send([flat[a:b]], self.peer, TAG) for a, b in spans]
            try:
                for w in works:
                    self._wait(w)
            finally:
                del flat, works
        return len(spans)

    # ------------------------------------------------------------------ receiver
    def recv_into(self, wbuf) -> int:
        """Receive one version into `wbuf`'s free slot and publish it; its version."""
        for _ in range(MAX_ATTEMPTS):
            kind, version, nbytes, bucket, n = self._recv_ints(5)
            if kind != DATA:
                raise ChannelError(f"weights over gloo: a head of kind {kind:#x} where a version's "
                                   f"head was due (the stream is out of step)")
            if not 0 <= nbytes <= wbuf.nbytes or bucket < 1 or n != -(-nbytes // bucket):
                raise ChannelError(f"weights over gloo: a head of {nbytes} bytes in {n} buckets of "
                                   f"{bucket} does not fit this node's buffer ({wbuf.nbytes} bytes)")
            crcs = self._recv_ints(n) if n else []
            try:
                wbuf.publish_from(lambda view: self._fill(view, version, bucket, crcs), nbytes,
                                  version)
                return version
            except _Again:
                continue
        raise ChannelError(f"weights over gloo: {MAX_ATTEMPTS} attempts in a row were dropped "
                           f"(the sender's slot kept being rewritten)")

    def _fill(self, view: memoryview, version: int, bucket: int, crcs: list) -> None:
        nbytes, bad = len(view), []
        spans = [(a, min(a + bucket, nbytes)) for a in range(0, nbytes, bucket)]
        if spans:
            flat = _tensor(view)
            try:
                work = self.pg.recv([flat[spans[0][0]:spans[0][1]]], self.peer, TAG)
                for k, (a, b) in enumerate(spans):
                    self._wait(work)
                    if k + 1 < len(spans):       # the next bucket lands while this one is checked
                        a2, b2 = spans[k + 1]
                        work = self.pg.recv([flat[a2:b2]], self.peer, TAG)
                    if zlib.crc32(view[a:b]) != crcs[k] & 0xFFFF_FFFF:
                        bad.append(k)
            finally:
                del flat
        kind, got = self._recv_ints(2)
        if kind == AGAIN:
            raise _Again()
        if kind != DONE or got != version:
            raise ChannelError(f"weights over gloo: trailer {kind:#x} v{got} after version "
                               f"{version} (the stream is out of step)")
        if bad:
            a = bad[0] * bucket
            raise ChannelError(f"weights v{version} over gloo: bucket {bad[0]} of {len(spans)} "
                               f"(bytes {a}-{min(a + bucket, nbytes)}) failed its CRC-32 check"
                               f"{f' ({len(bad)} buckets did)' if len(bad) > 1 else ''}")

    # ------------------------------------------------------------------ plumbing
    def _send_ints(self, values: list) -> None:
        self._wait(self.pg.send([torch.tensor(values, dtype=torch.int64)], self.peer, TAG))

    def _recv_ints(self, n: int) -> list:
        t = torch.empty(n, dtype=torch.int64)
        self._wait(self.pg.recv([t], self.peer, TAG))
        return t.tolist()

    def _wait(self, work) -> None:
        work.wait(_td(self.timeout_s))

    def close(self) -> None:
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                pg.shutdown()
            except RuntimeError:
                pass


class _Again(Exception):
    """The sender dropped the attempt being received (its slot was rewritten meanwhile)."""


def _tensor(view: memoryview) -> torch.Tensor:
    """A uint8 tensor over `view`'s bytes (no copy; a read-only view is only ever sent)."""
    return torch.frombuffer(view, dtype=torch.uint8)


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)
