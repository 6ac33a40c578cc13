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
import time
from typing import Any

from raymodel._internal import runtime, serialization
from raymodel.exceptions import RayModelError, TrainingError, TuneError
from raymodel.jobs._names import DONE, NAME, NAMESPACE
from raymodel.jobs._views import LONG_POLL_S, Stream, held

__all__ = ["Job", "list", "records", "get", "held", "server", "pools", "release_pools", "Pool", "submit"]

_list = list


def server(start: bool = True) -> Any:
    """The training server's actor handle (started, detached, if none is running; ``None`` then
    with ``start=False``)."""
    import ray

    from raymodel.jobs._server import JobServerActor

    runtime.ensure_ray(False)
    try:
        return ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        if not start:
            return None
        return JobServerActor.options(
            name=NAME,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_concurrency=256,
            scheduling_strategy=runtime.on_this_node(),
        ).remote(runtime.home(), runtime.pool_idle_s())


class JobNotFound(RayModelError):
    """No job with that id on this cluster's server."""


class Job:
    """A handle on a job of the training server; any process attached to the cluster may hold one."""

    def __init__(self, record: dict[str, Any], handle: Any = None) -> None:
        self.id, self.kind = record["id"], record["kind"]
        #: The record as it was when this handle was made (``rm.jobs.list()``: no call per field).
        self.summary: dict[str, Any] = dict(record)
        self._server = handle if handle is not None else server()

    def _record(self, until_done: float = 0.0) -> dict[str, Any]:
        import ray

        record = ray.get(self._server.get.remote(self.id, until_done))
        if record is None:
            raise JobNotFound(f"No job `{self.id}` on this cluster's raymodel server.")
        return record

    @property
    def status(self) -> str:
        """``PENDING`` | ``RUNNING`` | ``SUCCEEDED`` | ``FAILED`` | ``STOPPED``."""
        return self._record()["status"]

    @property
    def reason(self) -> str | None:
        """What the job waits for: a PENDING job's resource (or "preempted by <id>"), a RUNNING job's
        lost workers ("waiting for 1 more CPU for 1 worker of 2: node ... lost at epoch 4"); else ``None``."""
        return self._record().get("reason")

    @property
    def eta(self) -> float | None:
        """Seconds until a PENDING job is expected to start, or a RUNNING job to end (from the running
        jobs' epochs left and their mean epoch time); ``None`` when not known yet or done."""
        return self._record().get("eta")

    @property
    def registered(self) -> str | None:
        """The version a job by reference registered (``"digits:4"``) once it succeeded; else ``None``."""
        return self._record().get("registered")

    @property
    def changes(self) -> list[dict[str, Any]]:
        """What ``update`` changed: ``[{"epoch": from, "config": {...}, "settings": {...}}, ...]``
        (``"epoch": None`` until the next epoch boundary)."""
        return [
            {k: c.get(k) for k in ("epoch", "config", "settings", "note") if k != "note" or c.get("note")}
            for c in self._record().get("changes") or ()
        ]

    def update(self, config: dict[str, Any] | None = None, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        """Change a running (or queued) training job from its next epoch boundary, on every worker.

        ``settings``: ``num_epochs`` (not below the epochs done), ``checkpoint_every``,
        ``keep_checkpoints`` (jobs on a pool). ``config``: any key; it is merged into
        ``model.config``, the backend sets what it can (torch and Lightning: the optimizers' ``lr``,
        ``weight_decay``, ``momentum``, ``betas``, ``eps``; Keras: the learning rate; XGBoost and
        LightGBM: keys of ``self.params``), then the hook ``on_config_update(changes)`` runs.
        The change is kept in ``job.changes``, the history row of the epoch it took effect, and
        the checkpoints (a resumed run keeps it). Returns the change as recorded.

        Raises:
            SettingsError: the change is not allowed (the message names it); the job is untouched.
        """
        import ray

        from raymodel.exceptions import SettingsError

        if config is not None and not isinstance(config, dict):
            raise SettingsError(f"`config` must be a dict of config keys to new values (got {config!r}).")
        if settings is not None and not isinstance(settings, dict):
            raise SettingsError(f"`settings` must be a dict, e.g. {{'num_epochs': 40}} (got {settings!r}).")
        answer = ray.get(self._server.update.remote(self.id, config, settings))
        if "error" in answer:
            raise SettingsError(answer["error"])
        return answer["change"]

    @property
    def resources(self) -> dict[str, float]:
        """What the job holds now: its workers' (or trials') placement groups, from Ray's state API."""
        return held([self._record()])[self.id]

    def history(self) -> list[dict[str, Any]]:
        """The epoch rows so far (tune rows carry ``trial_id``)."""
        import ray

        return ray.get(self._server.rows.remote(self.id, 0))[0]

    def stream(self) -> Stream:
        """Each row as it arrives, from the first; ends when the job ends. Also an async iterator."""
        return Stream(self)

    def logs(self) -> str:
        """The job's log: submission, start, one line per epoch row, the end and any error."""
        return "\n".join(self._record()["log"])

    def stop(self) -> None:
        """Graceful: the current epoch ends on every worker, a checkpoint is written, resources are
        freed; the job ends STOPPED. A PENDING job is dropped from the queue."""
        self._server.stop.remote(self.id)

    def wait(self, timeout: float | None = None) -> Any:
        """The ``TrainResult`` or ``TuneResult`` (the result so far, for a STOPPED job).

        Raises:
            TimeoutError: the job is not done within ``timeout`` seconds.
            TrainingError / TuneError: the job FAILED (the message names the worker's exception).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _LONG_POLL_S if deadline is None else min(_LONG_POLL_S, deadline - time.monotonic())
            record = self._record(until_done=max(left, 0.0))  # the server answers as soon as it ends
            if record["status"] in DONE:
                return _outcome(record)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"Job `{self.id}` is still {record['status']} after {timeout} s.")

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, kind={self.kind!r})"


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


_LONG_POLL_S = LONG_POLL_S


def _outcome(record: dict[str, Any]) -> Any:
    if record["status"] == "FAILED":
        raise (TrainingError if record["kind"] == "train" else TuneError)(
            f"Job `{record['id']}` failed: {record['error']}"
        )
    if record.get("result") is None:
        return None  # stopped before it started
    if record["kind"] == "train":
        from raymodel.train import TrainResult

        return TrainResult(**record["result"])
    from raymodel.tune import TuneResult

    return TuneResult(**record["result"])


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
    from raymodel.jobs._by_ref import resolve

    model, data, extra = resolve(ref, kind, data, config, register, registry)
    if kind == "train":
        from raymodel.train import prepare

        checked, spec = prepare(model, settings, data)
        return _submit_checked(model, checked, spec, extra=extra)
    return submit_tune(model, space, settings, data, False, extra=extra)


def submit_train(model: Any, settings: Any, data: Any) -> Job:
    """``model.train(..., wait=False)``: every check first (as ``train()``), then the job is queued."""
    from raymodel.train import prepare

    settings, spec = prepare(model, settings, data)
    return _submit_checked(model, settings, spec)


def _submit_checked(model: Any, settings: Any, spec: Any, hub: Any = None, extra: dict[str, Any] | None = None) -> Job:
    """Queue a training job whose settings and data ``prepare`` checked; ``hub``: a blocking caller's,
    for its progress output; ``extra``: more for the server (``register``)."""
    import ray

    from raymodel.train._job import train_request

    blob, info = train_request(model, settings, spec, hub=hub)
    info.update(extra or {})
    record = ray.get(server().submit.remote("train", blob, info))
    if record["status"] == "FAILED" and hub is not None:
        raise TrainingError(record["error"])  # a blocking call: it can never run here
    return Job(record)


def submit_tune(
    model: Any, space: Any, settings: Any, data: Any, resume: bool, extra: dict[str, Any] | None = None
) -> Job:
    """``model.tune(..., wait=False)``: checked as ``tune()`` checks, then queued."""
    from raymodel.train import worker_resources
    from raymodel.tune import Tunable
    from raymodel.tune._trial import PLACEMENT_FIELDS, trial_resources

    tunable = Tunable(model, space, settings=settings, data=data, resume=resume)  # every check, no Ray yet
    ts = tunable.train_settings
    trial = trial_resources(**{n: getattr(ts, n) for n in PLACEMENT_FIELDS})
    if ts.num_workers > 1 and not ts.pool:  # the trial's sliver and its worker group (a pool's are its own jobs)
        for k, v in worker_resources(ts.resources_per_worker, ts.use_gpu).items():
            trial[k] = trial.get(k, 0.0) + v * ts.num_workers
    settings = dataclasses.replace(tunable.settings, name=tunable.name)
    payload = {
        "class": type(model),
        "config": dict(model.config),
        "settings": settings,
        "data": tunable.spec,
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
        **(extra or {}),
    )


def _submit(
    kind: str, model: Any, payload: dict[str, Any], needs: dict[str, float], settings: Any, epochs: int, **more: Any
) -> Job:
    import ray

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
    record = ray.get(server().submit.remote(kind, blob, info))
    return Job(record)
