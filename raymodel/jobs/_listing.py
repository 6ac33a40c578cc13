"""Reading the training server's books: its pools (``rm.jobs.pools()``, ``release_pools``) and its jobs
(``rm.jobs.list()``, ``records``, ``get``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from raymodel.exceptions import RayModelError
from raymodel.jobs._client import call, server_handle
from raymodel.jobs._job import Job, JobNotFound


@dataclasses.dataclass(frozen=True)
class Pool:
    """A resident worker group of the training server (``rm.jobs.pools()``).

    Attributes:
        id: The pool's id (its Ray Train run's name).
        key: What its workers are: the kind of backend (``backend``), number of workers, resources of each.
        backend: The kind of backend whose jobs it runs (``"torch"``: torch's, Lightning's and transformers',
            whose runs are the same worker group; ``"xgboost"``, ...).
        num_workers: Its workers.
        resources: What it holds in all (e.g. ``{"CPU": 2.0}``).
        state: ``"busy"`` (running a job), ``"idle"``, ``"starting"`` (a warm pool whose workers
            are still starting: a job that fits takes it all the same) or ``"ending"``.
        warm: Kept warm (``rm.init(warm=...)``, ``raymodel server start --warm``): it does not end
            for being idle.
        jobs_run: Jobs it has run.
        idle_since: When it became idle (a Unix time), ``None`` while busy.
        job: The job it runs now, if any.
        started: When it was started (a Unix time).
    """

    id: str
    key: str
    backend: str
    num_workers: int
    resources: dict[str, float]
    state: str
    jobs_run: int
    idle_since: float | None
    job: str | None
    started: float
    warm: bool = False


def pools() -> list[Pool]:
    """The training server's pools, oldest first (``[]`` when no server runs)."""
    handle = server_handle(start=False)
    if handle is None:
        return []
    return [_as_pool(p) for p in call(handle, "pools_info")]


def _as_pool(info: dict[str, Any]) -> Pool:
    state = "busy" if info["state"] == "starting" else info["state"]
    if state == "idle" and not info.get("ready", True):
        state = "starting"
    return Pool(
        id=info["id"],
        key=info["key"],
        backend=info["backend"],
        num_workers=info["num_workers"],
        resources=dict(info["needs"]),
        state=state,
        jobs_run=info["jobs_run"],
        idle_since=info["idle_since"],
        job=info["job"],
        started=info["started"],
        warm=bool(info.get("warm")),
    )


def release_pools() -> list[str]:
    """End every idle pool now and return once their resources are back; the ids of those ended."""
    handle = server_handle(start=False)
    return [] if handle is None else call(handle, "release_pools")


def wait_warm(specs: Sequence[tuple[str, int]], timeout_s: float = 600.0) -> float:
    """Wait until the server holds a ready warm pool of each ``(backend, workers)`` in ``specs`` (one
    that a job has already taken counts); the seconds waited. A ``RayModelError`` names those not ready
    after ``timeout_s`` (the server keeps warming them: ``raymodel server status`` shows them)."""
    from raymodel.jobs._request import pool_kind
    from raymodel.jobs._warm import pool_backends

    specs = [(b, n) for b, n in specs if b in pool_backends()]  # `rllib`: warmed by name, no pool to wait for
    kinds = {b: pool_kind(pool_backends()[b]) for b, _ in specs}  # lightning:2 is a pool of torch's kind
    began = time.monotonic()
    while True:
        held = [p for p in pools() if p.warm and p.state in ("idle", "busy")]
        missing = [(b, n) for b, n in specs if not any(p.backend == kinds[b] and p.num_workers == n for p in held)]
        waited = time.monotonic() - began
        if not missing:
            return waited
        if waited >= timeout_s:
            raise RayModelError(
                f"Warm pools not ready after {timeout_s:g} s: {', '.join(f'{b}:{n}' for b, n in missing)}. "
                "The server keeps warming them in the background; `raymodel server status` shows its pools."
            )
        time.sleep(0.2)


def list_jobs() -> list[Job]:
    """A ``Job`` handle on every job the server knows, oldest first; each one's ``summary`` holds its
    record as listed (status, reason, model class, times, epochs so far)."""
    handle = server_handle()
    return [Job(record, handle) for record in records(handle)]


def records(handle: Any = None) -> list[dict[str, Any]]:
    """Every job's record as a dict (oldest first): what ``list_jobs()`` (``rm.jobs.list()``) wraps, for
    tables of many jobs."""
    return call(handle or server_handle(), "list")


def get(job_id: str) -> Job:
    """The job ``job_id``; ``JobNotFound`` names the ids that exist when there is none."""
    handle = server_handle()
    record = call(handle, "get", job_id)
    if record is None:
        known = [r["id"] for r in records()][-5:]
        raise JobNotFound(
            f"No job `{job_id}` on this cluster's raymodel server. "
            f"Recent jobs: {', '.join(known) if known else '(none)'}."
        )
    return Job(record, handle)
