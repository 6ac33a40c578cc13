"""A blocking ``model.train()``: a job of the training server, waited for with the same output as a run of its own."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from raymodel._ray import cluster
from raymodel.exceptions import TrainingError
from raymodel.jobs._client import follow
from raymodel.jobs._constants import DONE
from raymodel.jobs._job import Job, submit_checked, submit_request


def train_on_server(model: Any, settings: Any, data: Any) -> Any:
    """``model.train(settings, data=...)``: a job of the training server on a pool, waited for, with
    the same output as a one-off run (bars in a terminal, a line per epoch elsewhere); the instance
    holds the trained weights afterwards."""
    from raymodel._ray import remote
    from raymodel.train import ProgressPrinter, prepare

    settings, spec = prepare(model, settings, data)  # every check, before Ray is touched
    if remote.active() is not None:
        return _train_off_cluster(model, settings, spec)
    cluster.ensure_ray(settings.verbose)
    hub = _progress_hub() if settings.progress else None
    printer = None
    if hub is not None:
        printer = ProgressPrinter(hub, type(model).__name__, settings.num_epochs, model.backend.epoch_unit)
    job = submit_checked(model, settings, spec, hub)
    try:
        record = _await(job, printer)
    except KeyboardInterrupt:
        job.stop()  # the current epoch ends, a checkpoint is written
        raise
    return _trained(model, record)


def _trained(model: Any, record: dict[str, Any]) -> Any:
    """The ``TrainResult`` of a blocking run's final record, its weights loaded into ``model``."""
    from raymodel.train import TrainResult

    if record["status"] == "FAILED":
        raise TrainingError(record["error"])
    result = TrainResult(**record["result"])
    if result.checkpoint is not None:
        model.load_weights(result.checkpoint)
    return result


_HUBS: dict[Any, Any] = {}
logger = logging.getLogger("raymodel")


def _progress_hub() -> Any:
    """This process's hub for the progress of its blocking runs (one at a time), started once: an
    actor start costs about half a second, more than a small job's epochs."""
    import ray

    key = ray.get_runtime_context().get_job_id()
    hub = _HUBS.get(key)
    if hub is None:
        from raymodel.train import start_hub

        hub = _HUBS[key] = start_hub()
    ray.get(hub.pop.remote(0.0))  # anything a run before this one left
    return hub


#: A reason the job still waits for is said again after this many seconds.
_REPEAT_S = 30.0
#: Nothing is said in a job's first second (a job that starts at once has nothing to wait for).
_QUIET_S = 1.0


def _await(job: Job, printer: Any) -> dict[str, Any]:
    """Wait for ``job`` to end; say what it waits for (``_sayer``)."""
    with printer if printer is not None else _nothing():
        return follow(job, _sayer(job.id, printer), wait_s=1.0)


def _sayer(job_id: str, printer: Any) -> Callable[[dict[str, Any]], None]:
    """What says, of each record of a job followed, what it waits for (a new reason at once, the same one
    again at most every ``_REPEAT_S``), and when it starts a pool."""
    shown: dict[str, float] = {}
    started = time.monotonic()

    def say(record: dict[str, Any]) -> None:
        if record["status"] in DONE:
            return
        reason = record.get("reason")  # PENDING: what it waits for; RUNNING: lost workers
        if printer is None:  # progress off: a wait is still said, as a warning of raymodel's logger
            now = time.monotonic()
            if reason and now - started > _QUIET_S and now - shown.get(reason, -1e9) > _REPEAT_S:
                logger.warning("raymodel: job %s: %s", job_id, reason)
                shown[reason] = now
            return
        if record["status"] == "RUNNING" and not reason:
            log = record.get("log", ())
            starting = [line for line in log if " starting pool " in line or " taking warm pool " in line]
            if starting:  # "... starting pool <id> of 2 torch worker(s)", "... taking warm pool <id> of ..."
                workers = starting[0].split(" of ", 1)[1]
                reason = f"starting a pool of {workers} (once: later runs reuse them)"
                if " taking warm pool " in starting[0]:
                    reason = f"a warm pool of {workers} is still starting (once: later runs reuse it)"
        now = time.monotonic()
        if reason and now - started > _QUIET_S and now - shown.get(reason, -1e9) > _REPEAT_S:
            repeat = reason in shown and not reason.startswith("starting a pool")
            if repeat or reason not in shown:
                print(f"[{printer.label}] {reason}", file=printer.stream, flush=True)
            shown[reason] = now

    return say


# ------------------------------------------------------------ off the cluster
def _train_off_cluster(model: Any, settings: Any, spec: Any) -> Any:
    """A blocking ``model.train`` from a client off the cluster: the job is made here (its arrays
    written to the storage both reach), then one call of the cluster's submits it and follows it,
    sending its rows and its waits here as they come."""
    from raymodel._ray import remote
    from raymodel.jobs._request import train_request
    from raymodel.train import ProgressPrinter

    blob, info = train_request(model, settings, spec)
    printer = None
    if settings.progress:
        printer = ProgressPrinter(None, type(model).__name__, settings.num_epochs, model.backend.epoch_unit)
    say = _sayer(info["id"], printer)

    def on_event(event: tuple[str, Any]) -> None:
        kind, value = event
        if kind == "rows" and printer is not None:
            printer.show(value)
        elif kind == "record":
            say(value)

    with printer if printer is not None else _nothing():
        record = remote.call(_train_here, blob, info, printer is not None, on_event=on_event)
    return _trained(model, record)


def _train_here(blob: bytes, info: dict[str, Any], progress: bool) -> dict[str, Any]:
    """On the cluster, in a call's driver: submit the job a client made and follow it to its end,
    sending the client its rows and every change of what it waits for; its final record."""
    import ray

    from raymodel._ray import remote

    cluster.ensure_ray(False)
    hub = _progress_hub() if progress else None
    job = submit_request("train", blob, {**info, "hub": hub})
    if job.summary["status"] == "FAILED":
        raise TrainingError(job.summary["error"])  # it can never run here
    done = threading.Event()

    def relay(hub: Any) -> None:
        while True:
            ended = done.is_set()
            rows = ray.get(hub.pop.remote(0.0 if ended else 0.5))
            if rows:
                remote.emit(("rows", rows))
            if ended:
                return

    relaying = (
        threading.Thread(target=relay, args=(hub,), name="raymodel-rows", daemon=True) if hub is not None else None
    )
    if relaying is not None:
        relaying.start()
    said: list[Any] = []

    def on_record(record: dict[str, Any]) -> None:
        brief = {k: record.get(k) for k in ("status", "reason")}
        brief["log"] = [line for line in record.get("log", ()) if " pool " in line][:1]
        if brief != (said[-1] if said else None):
            said[:] = [brief]
            remote.emit(("record", brief))

    try:
        return follow(job, on_record, wait_s=1.0)
    except KeyboardInterrupt:
        job.stop()  # the client's Ctrl-C: the current epoch ends, a checkpoint is written
        raise
    finally:
        done.set()
        if relaying is not None:
            relaying.join(timeout=10)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
