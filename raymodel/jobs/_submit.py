"""Putting work on the training server: ``model.train(..., wait=False)`` and ``model.tune(..., wait=False)``
(``submit_train``, ``submit_tune``), a blocking ``model.train`` on a pool (``train_and_wait``), and a job
that starts from a registry version (``rm.jobs.submit``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from raymodel.exceptions import SettingsError
from raymodel.jobs import _store
from raymodel.jobs._job import Job, submit_checked, submit_payload


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
    gate: Any = None,
    route: str | None = None,
    rollout: Any = None,
) -> Job:
    """Train (or tune) the registry version ``ref`` names (``"digits@production"``, ``"digits:3"``,
    ``"digits"``) as a job of the server, from its weights and config (``config`` merged over).

    ``kind``: ``"train"`` (further), ``"tune"`` (over ``space`` or ``hyperparameter_space``) or
    ``"release"`` (trained further, then ``gate``, ``route`` and ``rollout`` as ``model.release``);
    ``settings``: ``TrainSettings`` (``TuneSettings``) or a dict; ``data``: what ``train`` takes, or
    ``"package.module:OBJECT"`` (a function there is called for it). ``register="KEY[@ALIAS]"``: when
    the job succeeds, its final (a tune job's best) checkpoint becomes the next version of ``KEY``,
    whose lineage's ``parent`` names ``ref``'s version; ``job.registered`` says which. Every check
    runs here first (reference, config keys, name, data, settings): nothing is queued if one fails.
    """
    from raymodel.jobs._from_registry import resolve

    model, data, extra = resolve(ref, kind, data, config, register, registry)
    if kind == "release":
        from raymodel.jobs._release import submit_release

        if register is None:
            raise SettingsError("A release registers its candidate: give `register='KEY@ALIAS'`.")
        return submit_release(
            model,
            data=data,
            settings=settings,
            register=register,
            gate=gate,
            route=route,
            rollout=rollout,
            registry=registry,
            parent=extra["register"]["parent"],
        )
    if gate is not None or route is not None or rollout is not None:
        raise SettingsError(f"`gate`, `route` and `rollout` are a release's (`kind='release'`), not a {kind} job's.")
    if kind == "train":
        from raymodel.train import prepare

        checked, spec = prepare(model, settings, data)
        return submit_checked(model, checked, spec, extra=extra)
    return submit_tune(model, space, settings, data, False, extra=extra)


def train_and_wait(model: Any, settings: Any, data: Any) -> Any:
    """A blocking ``model.train(settings, data=...)`` on a pool: a job of the server, waited for, with
    the same output as a one-off run; the instance holds the trained weights afterwards."""
    from raymodel.jobs._blocking import train_on_server

    return train_on_server(model, settings, data)


def tune_and_wait(model: Any, space: Any, settings: Any, data: Any, resume: bool) -> Any:
    """A blocking ``model.tune`` from a client off the cluster: a tune job of the cluster's server,
    waited for; the instance takes the best trial's config and weights."""
    from raymodel.tune import load_best

    job = submit_tune(model, space, settings, data, resume)  # every check first, here
    print(f"[{type(model).__name__}] tuning as job {job.id} of the cluster's training server", flush=True)
    result = job.wait()
    load_best(model, result)
    return result


def submit_train(model: Any, settings: Any, data: Any) -> Job:
    """``model.train(..., wait=False)``: every check first (as ``train()``), then the job is queued."""
    from raymodel.train import prepare

    settings, spec = prepare(model, settings, data)
    return submit_checked(model, settings, spec)


def submit_tune(
    model: Any, space: Any, settings: Any, data: Any, resume: bool, extra: dict[str, Any] | None = None
) -> Job:
    """``model.tune(..., wait=False)``: checked as ``tune()`` checks, then queued."""
    from raymodel._ray import remote
    from raymodel.jobs._request import tune_payload, why_not_durable
    from raymodel.tune import Tunable

    tunable = Tunable(model, space, settings=settings, data=data, resume=resume)  # every check, no Ray yet
    remote.refuse_local("TuneSettings.storage_path", tunable.settings.storage_path)
    remote.refuse_local("TuneSettings.train.storage_path", tunable.settings.train.storage_path)
    trial = tunable.trial_needs  # a trial's worker group on a pool is a job of its own
    settings = dataclasses.replace(tunable.settings, name=tunable.name)
    job_id = _store.new_id("tune")
    payload = tune_payload(model, tunable, settings, job_id, resume)
    return submit_payload(
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
