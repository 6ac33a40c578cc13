"""Submitting training and tune jobs to the server: every check first, then the request."""

from __future__ import annotations

import dataclasses
from typing import Any

from raymodel._internal import serialization
from raymodel.exceptions import TrainingError
from raymodel.jobs import Job, server

__all__ = ["_submit_checked", "submit_train", "submit_tune"]


def submit_train(model: Any, settings: Any, data: Any) -> Job:
    """``model.train(..., wait=False)``: every check first (as ``train()``), then the job is queued."""
    from raymodel.train import prepare

    settings, spec = prepare(model, settings, data)
    return _submit_checked(model, settings, spec)


def _submit_checked(model: Any, settings: Any, spec: Any, hub: Any = None) -> Job:
    """Queue a training job whose settings and data ``prepare`` checked; ``hub``: a blocking caller's,
    for its progress output."""
    import ray

    from raymodel.train._job import train_request

    blob, info = train_request(model, settings, spec, hub=hub)
    record = ray.get(server().submit.remote("train", blob, info))
    if record["status"] == "FAILED" and hub is not None:
        raise TrainingError(record["error"])  # a blocking call: it can never run here
    return Job(record)


def submit_tune(model: Any, space: Any, settings: Any, data: Any, resume: bool) -> Job:
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
