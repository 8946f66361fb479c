"""Workloads: datasets, tokenization and chat rendering, rewards (ARCHITECTURE.md "Layout as it grows")."""
