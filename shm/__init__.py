"""Shared-memory transport: SPSC ring buffers, rollout codec, weight buffers."""
