"""Ray Train ``UserCallback``s of the training server: on a job's (or a pool's) Train controller, they tell
the server each report's row and which workers failed.

Its own module: importing ``ray.train`` takes about a second, and only a run needs it.
"""

from __future__ import annotations

from typing import Any

from ray.train import UserCallback


class JobRows(UserCallback):
    """Each report's rank-0 metrics (with ``checkpoint_path``) to the job server, for a job's stream."""

    def __init__(self, server: Any, job_id: str) -> None:
        self.server, self.job_id = server, job_id

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if metrics:
            self.server.push.remote(self.job_id, [{k: v for k, v in metrics[0].items()}])


class JobFailures(UserCallback):
    """On a job's one-off Train controller: tells the server its workers failed (it watches whether
    Ray can place them again, and says what the job waits for)."""

    def __init__(self, server: Any, job_id: str) -> None:
        self.server, self.job_id = server, job_id

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        self.server.worker_lost.remote(self.job_id, {r: _failure_text(e) for r, e in worker_exceptions.items()})


class PoolFailures(UserCallback):
    """On a pool's Train controller: tells the pool which workers failed, before Ray Train restarts them."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        import ray

        ray.get(self.pool.failure.remote({rank: _failure_text(e) for rank, e in worker_exceptions.items()}))


def _failure_text(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[-1] if text else ''}"
