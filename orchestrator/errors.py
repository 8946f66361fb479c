"""Run-level errors: what the supervisor reports and the exit code launch maps them to."""
from __future__ import annotations


class RunFailed(RuntimeError):
    """The run cannot continue; `exit_code` is 2 for bad input, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class EmptyBatches(RunFailed):
    pass


class Interrupted(RunFailed):
    """SIGINT/SIGTERM arrived before the run could drain (startup, resume recovery): exit 128+sig."""

    def __init__(self, signum: int, where: str):
        super().__init__(f"stopped by signal {signum} during {where}", 128 + signum)
        self.signum = signum
