"""Run-level errors: what the supervisor reports and the exit code launch maps them to."""
from __future__ import annotations


class RunFailed(RuntimeError):
    """The run cannot continue; `exit_code` is 2 for bad input, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class EmptyBatches(RunFailed):
    pass
