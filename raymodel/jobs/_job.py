"""A job of the training server as its callers hold it (``Job``), and handing the server a job."""

from __future__ import annotations

import logging
import time
from typing import Any

from raymodel._internal import serialization
from raymodel._ray import remote
from raymodel.exceptions import RayModelError, TrainingError, TuneError
from raymodel.jobs._client import call, server_handle
from raymodel.jobs._constants import DONE
from raymodel.jobs._views import LONG_POLL_S, Stream, held

_LONG_POLL_S = LONG_POLL_S
#: How long a client waits for a restarted training server before it gives up.
_RECONNECT_S = 120.0
logger = logging.getLogger("raymodel")


class JobNotFound(RayModelError):
    """No job with that id on this cluster's server."""


class Job:
    """A handle on a job of the training server; any process attached to the cluster may hold one."""

    def __init__(self, record: dict[str, Any], handle: Any = None) -> None:
        self.id, self.kind = record["id"], record["kind"]
        #: The record as it was when this handle was made (``rm.jobs.list()``: no call per field).
        self.summary: dict[str, Any] = dict(record)
        self._server = handle if handle is not None else server_handle()
        #: The record once a stream of this handle saw the job end (an ended job's record is final).
        self._ended: dict[str, Any] | None = None

    def _call(self, method: str, *args: Any) -> Any:
        """``server.<method>(*args)``, riding through a restart of the server's actor: Ray retries the
        call on the restarted actor; a handle whose actor is gone for good is looked up again."""
        import ray

        deadline = time.monotonic() + _RECONNECT_S
        said = False
        while True:
            try:
                return call(self._server, method, *args)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                if time.monotonic() > deadline:
                    raise RayModelError(
                        f"The training server did not come back within {_RECONNECT_S:g} s ({exc}); "
                        "`raymodel server status` shows whether it runs."
                    ) from exc
                if not said:
                    logger.warning("raymodel: the training server restarted; job %s waits for it to come back", self.id)
                    said = True
                time.sleep(0.5)
                self._server = server_handle(start=False) or self._server

    def _record(self, until_done: float = 0.0) -> dict[str, Any]:
        record = self._call("get", self.id, until_done)
        if record is None:
            raise JobNotFound(f"No job `{self.id}` on this cluster's raymodel server.")
        return record

    @property
    def status(self) -> str:
        """``PENDING`` | ``RUNNING`` | ``SUCCEEDED`` | ``FAILED`` | ``STOPPED``; a release also ``REJECTED``
        (its gate) | ``ROLLED_BACK`` (its rollout's guard)."""
        return self._record()["status"]

    @property
    def stage(self) -> str | None:
        """A release's stage: ``"train"`` | ``"evaluate"`` | ``"register"`` | ``"rollout"`` | ``"promote"``
        (the one under way, or the last when it ended); ``None`` for other jobs."""
        if self.kind != "release":
            return None
        from raymodel.jobs._release_plan import current_stage

        rows, status = self._call("rows", self.id, 0)
        return current_stage(rows, status)

    @property
    def durable(self) -> bool:
        """Whether the job outlives its server: its record, payload and data are in the server's
        storage, so a restarted server (or head) runs it again. ``False`` for data held only in this
        cluster's object store (a ``ray.data`` Dataset, ObjectRefs): ``job.logs()`` says why."""
        return bool(self.summary.get("durable", False))

    @property
    def reason(self) -> str | None:
        """What the job waits for: a PENDING job's resource (or "preempted by <id>"), a RUNNING job's
        lost workers ("waiting for 1 more CPU for 1 worker of 2: node ... lost at epoch 4"); else ``None``."""
        return self._record().get("reason")

    @property
    def error(self) -> str | None:
        """Why a FAILED job failed: the error line (the worker's exception, or what the server found);
        ``None`` for any other status. ``logs()`` has the traceback's last lines."""
        record = self._record()
        return record.get("error") if record["status"] == "FAILED" else None

    @property
    def eta(self) -> float | None:
        """Seconds until a PENDING job is expected to start, or a RUNNING job to end (from the running
        jobs' epochs left and their median epoch time); ``None`` when not known yet or done."""
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
        LightGBM: keys of ``self.params``; RLlib: the learner's ``lr``), then the hook
        ``on_config_update(changes)`` runs.
        The change is kept in ``job.changes``, the history row of the epoch it took effect, and
        the checkpoints (a resumed run keeps it). Returns the change as recorded.

        Raises:
            SettingsError: the change is not allowed (the message names it); the job is untouched.
        """
        from raymodel.exceptions import SettingsError

        if config is not None and not isinstance(config, dict):
            raise SettingsError(f"`config` must be a dict of config keys to new values (got {config!r}).")
        if settings is not None and not isinstance(settings, dict):
            raise SettingsError(f"`settings` must be a dict, e.g. {{'num_epochs': 40}} (got {settings!r}).")
        answer = self._call("update", self.id, config, settings)
        if "error" in answer:
            raise SettingsError(answer["error"])
        return answer["change"]

    @property
    def resources(self) -> dict[str, float]:
        """What the job holds now: its workers' (or trials') placement groups, from Ray's state API."""
        return held([self._record()])[self.id]

    def history(self) -> list[dict[str, Any]]:
        """The epoch rows so far (tune rows carry ``trial_id``)."""
        return self._call("rows", self.id, 0)[0]

    def stream(self) -> Stream:
        """Each row as it arrives, from the first; ends when the job ends. Also an async iterator."""
        return Stream(self)

    def _follow_off_cluster(self, seen: int, on_row: Any) -> Any:
        """From a client off the cluster: one call follows the job there from its ``seen``-th row,
        ``on_row(row)`` here for each as it comes; the job's final record."""
        return remote.call(_follow_here, self.id, seen, on_event=on_row)

    def logs(self) -> str:
        """The job's log: submission, start, one line per epoch row, the end and any error."""
        return "\n".join(self._record()["log"])

    def stop(self) -> None:
        """Graceful: the current epoch ends on every worker, a checkpoint is written, resources are
        freed; the job ends STOPPED. A PENDING job is dropped from the queue."""
        self._call("stop", self.id)

    def wait(self, timeout: float | None = None) -> Any:
        """The ``TrainResult`` or ``TuneResult`` (the result so far, for a STOPPED job).

        Raises:
            TimeoutError: the job is not done within ``timeout`` seconds.
            TrainingError / TuneError: the job FAILED (the message names the worker's exception).
        """
        if self._ended is not None:
            return _outcome(self._ended)
        if remote.active() is not None:  # off the cluster: one call waits there, not a call per look
            return _outcome(remote.call(_wait_here, self.id, timeout))
        return _outcome(self._final_record(timeout))

    def _final_record(self, timeout: float | None) -> dict[str, Any]:
        """The job's record once it ends (long polls of the server); ``TimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _LONG_POLL_S if deadline is None else min(_LONG_POLL_S, deadline - time.monotonic())
            record = self._record(until_done=max(left, 0.0))  # the server answers as soon as it ends
            if record["status"] in DONE:
                return record
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"Job `{self.id}` is still {record['status']} after {timeout} s.")

    def __repr__(self) -> str:
        try:
            record = self._record()
        except Exception:  # noqa: BLE001 - a repr never fails: the server may be gone
            return f"Job(id={self.id!r}, kind={self.kind!r})"
        error = f", error={record.get('error')!r}" if record["status"] == "FAILED" else ""
        return f"Job(id={self.id!r}, kind={self.kind!r}, status={record['status']!r}{error})"


def _by_id(job_id: str) -> Job:
    """On the cluster: the job ``job_id``."""
    handle = server_handle()
    record = call(handle, "get", job_id)
    if record is None:
        raise JobNotFound(f"No job `{job_id}` on this cluster's raymodel server.")
    return Job(record, handle)


def _wait_here(job_id: str, timeout: float | None) -> dict[str, Any]:
    """On the cluster: the job's record once it ends (``TimeoutError`` after ``timeout`` seconds)."""
    return _by_id(job_id)._final_record(timeout)


def _follow_here(job_id: str, seen: int) -> Any:
    """On the cluster: the job's rows from the ``seen``-th, each sent to the client as it comes; the
    job's final record."""
    stream = Stream(_by_id(job_id))
    stream.seen = seen
    for row in stream:
        remote.emit(row)
    return stream.job._ended


def _outcome(record: dict[str, Any]) -> Any:
    if record["status"] == "FAILED":
        raise (TuneError if record["kind"] == "tune" else TrainingError)(
            f"Job `{record['id']}` failed: {record['error']}"
        )
    if record["kind"] == "release":
        from raymodel.jobs._release_plan import ReleaseResult

        result = dict(record.get("result") or {})
        fields = {k: result[k] for k in ("version", "stages", "train") if k in result}
        return ReleaseResult(record["status"], result.get("reason", "stopped before it started"), **fields)
    if record.get("result") is None:
        return None  # stopped before it started
    if record["kind"] == "train":
        from raymodel.train import TrainResult

        return TrainResult(**record["result"])
    from raymodel.tune import TuneResult

    return TuneResult(**record["result"])


def submit_checked(model: Any, settings: Any, spec: Any, hub: Any = None, extra: dict[str, Any] | None = None) -> Job:
    """Queue a training job whose settings and data ``prepare`` checked; ``hub``: a blocking caller's,
    for its progress output; ``extra``: more for the server (``register``)."""
    from raymodel.jobs._request import train_request

    blob, info = train_request(model, settings, spec, hub=hub)
    info.update(extra or {})
    job = submit_request("train", blob, info)
    if job.summary["status"] == "FAILED" and hub is not None:
        raise TrainingError(job.summary["error"])  # a blocking call: it can never run here
    return job


def submit_request(kind: str, blob: bytes, info: dict[str, Any]) -> Job:
    """Hand the server a job (``kind``, its pickled payload and what the server reads of it); the
    record it answers with is in the server's books. The job carries the runtime env this process's
    ``rm.init(runtime_env=...)`` named (``remote.job_env``): its runner and its pool are started with
    it, so a pool of another env's jobs (or of none) is not its."""
    env = info.get("runtime_env")
    if env is None:
        env = info["runtime_env"] = remote.job_env()
    if env and info.get("pool") and "runtime_env" not in info["pool"]:
        pool = info["pool"]
        info["pool"] = {**pool, "key": f"{pool['key']}+env:{remote.env_digest(env)}", "runtime_env": env}
    handle = server_handle()
    job = Job(call(handle, "submit", kind, blob, info), handle)
    if info.get("not_durable") and not info.get("trial_id"):
        logger.warning("raymodel: job %s is not durable (a server restart fails it): %s.", job.id, info["not_durable"])
    return job


def submit_payload(
    kind: str, model: Any, payload: dict[str, Any], needs: dict[str, float], settings: Any, epochs: int, **more: Any
) -> Job:
    """Hand the server a job of a payload (pickled here, with the classes of its settings' callbacks by
    value) that needs ``needs``; ``more``: what the server reads of it besides."""
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
