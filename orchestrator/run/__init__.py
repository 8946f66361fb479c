"""The run directory and its durability: everything a run leaves on disk, and how it is read back.

- `durable`: atomic writes, the fsync order, checksummed record files, disk-full errors.
- `run_dir`: one writer per directory, fresh start or resume, layout, compatibility, overwrite.
- `checkpoint`: the checkpoint directory protocol (manifest, validation, reuse, retention).
- `audit`: the promises a finished or running run must keep, read from disk (`python -m orchestrator.audit`).
- `export`: a checkpoint's HF model directory (`python -m orchestrator.export`).

Imports: config, messages, errors, shm.codec and this room; never the loop, the runtime or a backend
at import time (export loads nothing heavy until it copies a checkpoint).
"""
