"""Inference and trainer backends (sim, torch, vllm) behind the protocols in base.py."""
