"""Jobs: ``model.train(..., wait=False)`` and ``model.tune(..., wait=False)`` on the training server.

The server is a detached, named Ray actor (``raymodel-job-server``), used if
running and started if not; any process attached to the same cluster sees
every job::

    job = model.train(settings, data=data, wait=False)
    for row in job.stream(): ...
    job.stop(); result = job.wait()
    rm.jobs.list(); rm.jobs.get(job_id)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raymodel import contract
from raymodel._internal import serialization
from raymodel.jobs import _store
from raymodel.jobs._client import init, server_handle
from raymodel.jobs._constants import ACTIVE, DONE, UPDATABLE
from raymodel.jobs._from_registry import check_register, load_data, split_sets
from raymodel.jobs._job import Job, JobNotFound, _submit_checked, submit_request
from raymodel.jobs._port import ServerClient
from raymodel.jobs._views import Stream, held

__all__ = [
    "Job",
    "list",
    "records",
    "get",
    "held",
    "Stream",
    "JobNotFound",
    "server",
    "pools",
    "release_pools",
    "Pool",
    "submit",
    "submit_train",
    "submit_tune",
    "train_and_wait",
    "init",
    "ACTIVE",
    "DONE",
    "UPDATABLE",
    "check_register",
    "load_data",
    "split_sets",
]

#: The drivers below ``raymodel.jobs`` (train, tune, serve, predict) reach the server through this port.
contract.provide_training_server(ServerClient())


_list = list


def server(start: bool = True) -> Any:
    """The training server's actor handle (started, detached, if none is running; ``None`` then
    with ``start=False``)."""
    return server_handle(start)


@dataclasses.dataclass(frozen=True)
class Pool:
    """A resident worker group of the training server (``rm.jobs.pools()``).

    Attributes:
        id: The pool's id (its Ray Train run's name).
        key: What its workers are: backend, number of workers, resources of each.
        backend: The backend whose trainer runs it (``"torch"``, ...).
        num_workers: Its workers.
        resources: What it holds in all (e.g. ``{"CPU": 2.0}``).
        state: ``"busy"`` (running a job), ``"idle"`` or ``"ending"``.
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


def pools() -> _list[Pool]:
    """The training server's pools, oldest first (``[]`` when no server runs)."""
    import ray

    handle = server(start=False)
    if handle is None:
        return []
    return [_as_pool(p) for p in ray.get(handle.pools_info.remote())]


def _as_pool(info: dict[str, Any]) -> Pool:
    state = "busy" if info["state"] == "starting" else info["state"]
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
    )


def release_pools() -> _list[str]:
    """End every idle pool now and return once their resources are back; the ids of those ended."""
    import ray

    handle = server(start=False)
    return [] if handle is None else ray.get(handle.release_pools.remote())


def list() -> _list[Job]:
    """A ``Job`` handle on every job the server knows, oldest first; each one's ``summary`` holds its
    record as listed (status, reason, model class, times, epochs so far)."""
    handle = server()
    return [Job(record, handle) for record in records(handle)]


def records(handle: Any = None) -> _list[dict[str, Any]]:
    """Every job's record as a dict (oldest first): what ``list()`` wraps, for tables of many jobs."""
    import ray

    return ray.get((handle or server()).list.remote())


def get(job_id: str) -> Job:
    """The job ``job_id``; ``JobNotFound`` names the ids that exist when there is none."""
    import ray

    handle = server()
    record = ray.get(handle.get.remote(job_id))
    if record is None:
        known = [r["id"] for r in records()][-5:]
        raise JobNotFound(
            f"No job `{job_id}` on this cluster's raymodel server. "
            f"Recent jobs: {', '.join(known) if known else '(none)'}."
        )
    return Job(record, handle)


def submit(
    ref: str,
    kind: str = "train",
    *,
    settings: Any = None,
    data: Any = None,
    config: dict[str, Any] | None = None,
    space: dict[str, Any] | None = None,
    register: str | None = None,
    registry: str | None = None,
) -> Job:
    """Train (or tune) the registry version ``ref`` names (``"digits@production"``, ``"digits:3"``,
    ``"digits"``) as a job of the server, from its weights and config (``config`` merged over).

    ``kind``: ``"train"`` (further) or ``"tune"`` (over ``space`` or ``hyperparameter_space``);
    ``settings``: ``TrainSettings`` (``TuneSettings``) or a dict; ``data``: what ``train`` takes, or
    ``"package.module:OBJECT"`` (a function there is called for it). ``register="KEY[@ALIAS]"``: when
    the job succeeds, its final (a tune job's best) checkpoint becomes the next version of ``KEY``,
    whose lineage's ``parent`` names ``ref``'s version; ``job.registered`` says which. Every check
    runs here first (reference, config keys, name, data, settings): nothing is queued if one fails.
    """
    from raymodel.jobs._from_registry import resolve

    model, data, extra = resolve(ref, kind, data, config, register, registry)
    if kind == "train":
        from raymodel.train import prepare

        checked, spec = prepare(model, settings, data)
        return _submit_checked(model, checked, spec, extra=extra)
    return submit_tune(model, space, settings, data, False, extra=extra)


def train_and_wait(model: Any, settings: Any, data: Any) -> Any:
    """A blocking ``model.train(settings, data=...)`` on a pool: a job of the server, waited for, with
    the same output as a one-off run; the instance holds the trained weights afterwards."""
    from raymodel.jobs._blocking import train_on_server

    return train_on_server(model, settings, data)


def submit_train(model: Any, settings: Any, data: Any) -> Job:
    """``model.train(..., wait=False)``: every check first (as ``train()``), then the job is queued."""
    from raymodel.train import prepare

    settings, spec = prepare(model, settings, data)
    return _submit_checked(model, settings, spec)


def submit_tune(
    model: Any, space: Any, settings: Any, data: Any, resume: bool, extra: dict[str, Any] | None = None
) -> Job:
    """``model.tune(..., wait=False)``: checked as ``tune()`` checks, then queued."""
    from raymodel.jobs._request import arrays_to_files, why_not_durable
    from raymodel.tune import Tunable

    tunable = Tunable(model, space, settings=settings, data=data, resume=resume)  # every check, no Ray yet
    trial = tunable.trial_needs  # a trial's worker group on a pool is a job of its own
    settings = dataclasses.replace(tunable.settings, name=tunable.name)
    job_id = _store.new_id("tune")
    payload = {
        "class": type(model),
        "config": dict(model.config),
        "settings": settings,
        "data": arrays_to_files(tunable.spec, job_id),
        "space": tunable.space,
        "resume": resume,
    }
    return _submit(
        "tune",
        model,
        payload,
        trial,
        settings,
        tunable.settings.max_epochs,
        metric=tunable.metric,
        mode=tunable.settings.mode,
        priority=tunable.settings.priority,
        preemptible=tunable.settings.preemptible,
        id=job_id,
        not_durable=why_not_durable(tunable.spec),
        **(extra or {}),
    )


def _submit(
    kind: str, model: Any, payload: dict[str, Any], needs: dict[str, float], settings: Any, epochs: int, **more: Any
) -> Job:
    callbacks = [
        *(getattr(settings, "callbacks", ()) or ()),
        *(getattr(getattr(settings, "train", None), "callbacks", ()) or ()),
    ]
    blob = serialization.dumps(payload, type(model), *callbacks)
    info = {
        "needs": needs,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "settings": repr(settings),
        "epochs": epochs,
        **more,
    }
    return submit_request(kind, blob, info)
