"""GPU weight hand-off over CUDA IPC handles (trainer -> inference workers on one node).

Contract
- Trainer: `CudaIpcPublisher(device)`. `publish(version, nbytes, fill) -> bytes` takes a flat uint8
  CUDA buffer of `nbytes` (a fresh one, or one released earlier), lets `fill(tensor)` write the
  weights into it, synchronises the stream, and returns a small blob: the CUDA IPC handle of that
  buffer plus its version. The blob travels through the CPU `WeightBuffer` (so the version word
  and the weight watcher work unchanged); the weights themselves never leave the GPU. Every
  published buffer is kept alive until `release_below(v)` says all readers acknowledged version v.
- Inference: `open_blob(blob, device_index) -> (version, tensor)` maps the trainer's buffer into this
  process as a uint8 CUDA tensor on local ordinal `device_index` (the trainer's GPU must be visible
  to the reader: the supervisor appends it to the reader's CUDA_VISIBLE_DEVICES). The reader copies
  out of it and drops it before acknowledging.
- Blob format: magic b"ARLC", version (int64), then the pickled (rebuild function, args) pair of
  `torch.multiprocessing.reductions.reduce_tensor` with the device ordinal at `_DEVICE_ARG`.
Only used when the trainer runs on a GPU; tests are marked `gpu` and skip without one.
"""
from __future__ import annotations

import pickle
import struct

MAGIC = b"ARLC"
_HEAD = struct.Struct("<4sq")
_DEVICE_ARG = 6          # index of storage_device in rebuild_cuda_tensor's arguments


class CudaIpcPublisher:
    def __init__(self, device):
        import torch
        self.torch = torch
        self.device = torch.device(device)
        self._live: dict[int, object] = {}      # version -> CUDA buffer kept alive for readers
        self._free: list = []                   # released buffers, reused by size

    def publish(self, version: int, nbytes: int, fill) -> bytes:
        from torch.multiprocessing.reductions import reduce_tensor
        torch = self.torch
        buf = next((b for b in self._free if b.numel() == nbytes), None)
        if buf is not None:
            self._free.remove(buf)
        else:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        fill(buf)
        torch.cuda.synchronize(self.device)
        self._live[version] = buf
        rebuild, args = reduce_tensor(buf)
        return _HEAD.pack(MAGIC, version) + pickle.dumps((rebuild, args))

    def release_below(self, version: int) -> int:
        """Readers have all loaded `version`: buffers of older versions may be reused."""
        old = [v for v in self._live if v < version]
        for v in old:
            self._free.append(self._live.pop(v))
        return len(old)

    @property
    def live_versions(self) -> list[int]:
        return sorted(self._live)


def open_blob(blob: bytes, device_index: int):
    """(version, uint8 CUDA tensor viewing the publisher's buffer on local ordinal device_index)."""
    if len(blob) < _HEAD.size:
        raise ValueError("CUDA IPC blob is truncated")
    magic, version = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise ValueError("not a CUDA IPC weight blob (bad magic)")
    rebuild, args = pickle.loads(blob[_HEAD.size:])
    args = list(args)
    args[_DEVICE_ARG] = device_index
    return version, rebuild(*args)
