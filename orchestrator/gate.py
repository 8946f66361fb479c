"""`orchestrator.gate.StalenessGate`, the admission gate's contract name (ARCHITECTURE.md); the gate
lives with the rest of the event thread in `orchestrator.loop.gate`."""
from orchestrator.loop.gate import StalenessGate

__all__ = ["StalenessGate"]
