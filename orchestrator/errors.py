"""Run-level errors: what the supervisor reports and the exit code launch maps them to."""
from __future__ import annotations

# An inference worker whose environment hung exits with this code and no Fatal
# (task.env_on_hang=restart): a dead worker to restart, named as a hang in the run's messages.
ENV_HUNG_EXIT = 75      # EX_TEMPFAIL: try again


class ChannelError(RuntimeError):
    """A record between the supervisor and a Ray host (runtime/ray_host.py, ray_weights.py) arrived
    out of sequence or corrupt."""


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


class WorkerFatal(RunFailed):
    """A worker reported a Fatal: `role`, `index` and its one-line `error` kept for the supervisor
    (which names the rank that failed first when trainer ranks fail together)."""

    def __init__(self, message: str, role: str, index: int, error: str, exit_code: int = 1):
        super().__init__(message, exit_code)
        self.role, self.index, self.error = role, index, error


def worker_name(role: str, index: int, trainer_ranks: int = 1) -> str:
    """How messages name a worker: 'inference worker 1', 'trainer worker 0', or 'trainer rank 1'
    when the trainer has several ranks."""
    return f"trainer rank {index}" if role == "trainer" and trainer_ranks > 1 else f"{role} worker {index}"
