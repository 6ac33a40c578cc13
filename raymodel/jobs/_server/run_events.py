"""What the training server follows of its runs (``RunEvents``): each report's row, and which workers
failed, whatever the run's type (a Ray Train run, RLlib's Algorithm)."""

from __future__ import annotations

from typing import Any

from raymodel.contract import RunEvents


class JobRows(RunEvents):
    """Each report's rank-0 row to the job server, for a job's stream."""

    def __init__(self, server: Any, job_id: str) -> None:
        self.server, self.job_id = server, job_id

    def row(self, row: dict[str, Any], checkpoint: str | None) -> None:
        self.server.push.remote(self.job_id, [row])


class JobFailures(RunEvents):
    """A job's one-off run: tells the server its workers failed (it watches whether Ray can place them
    again, and says what the job waits for)."""

    def __init__(self, server: Any, job_id: str) -> None:
        self.server, self.job_id = server, job_id

    def workers_failed(self, failures: dict[int, str]) -> None:
        self.server.worker_lost.remote(self.job_id, failures)


class PoolFailures(RunEvents):
    """A pool's run: tells the pool which workers failed, before Ray Train restarts them."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def workers_failed(self, failures: dict[int, str]) -> None:
        import ray

        ray.get(self.pool.failure.remote(failures))
