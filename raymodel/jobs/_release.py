"""A release: ``model.release(...)`` and ``rm.jobs.submit(ref, "release", ...)``, every check first, then
one job of the training server that trains, gates, registers, rolls out and promotes
(``jobs/_server/release.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from raymodel.exceptions import DataError, SettingsError
from raymodel.jobs._job import Job, submit_payload, submit_request
from raymodel.jobs._release_plan import Gate, ReleaseResult, RolloutPlan, describe

#: What RLlib's evaluation reports (``RLlibLoop.score``): a model with no data is scored on these.
EPISODE_FIGURES = ("val_episode_return_mean", "val_episode_len_mean")


def submit_release(
    model: Any,
    *,
    data: Any = None,
    settings: Any = None,
    tune: Any = None,
    space: Any = None,
    register: str,
    gate: Any,
    route: str | None = None,
    rollout: Any = None,
    registry: str | None = None,
    parent: str | None = None,
) -> Job:
    """Check everything a release is given (before anything runs), then queue it as a job; ``parent``:
    the version it trains further (a release by reference), which its lineage names."""
    from raymodel._ray import remote
    from raymodel.jobs._from_registry import check_register
    from raymodel.registry import default_uri
    from raymodel.train import prepare

    gate, plan = Gate.coerce(gate), RolloutPlan.coerce(rollout)
    remote.refuse_local("`registry`", registry)
    if not isinstance(register, str):
        raise SettingsError(f"`register` is KEY or KEY@ALIAS, e.g. 'digits@candidate' (got {register!r}).")
    key, alias = check_register(register)
    tunable = None
    if tune is not None:
        from raymodel.tune import Tunable

        if settings is not None:
            raise SettingsError("A release trains (`settings=`) or tunes (`tune=`, trials' settings in it): not both.")
        tunable = Tunable(model, space, settings=tune, data=data)  # every check of `tune`, no Ray yet
        spec = tunable.spec
    else:
        if space is not None:
            raise SettingsError("`space` is a tuned release's: give `tune=rm.TuneSettings(...)` with it.")
        settings, spec = prepare(model, settings, data)
    gate_data = _held_out(model, spec, gate)
    registry_uri = registry or default_uri()
    _check_against(model, gate, key, registry_uri)
    if route is not None:
        _check_route(model, route, key)
    release = {
        "gate": dataclasses.replace(gate, data=None),
        "gate_data": gate_data,
        "route": route,
        "rollout": plan,
        "registry": registry_uri,
        "key": key,
        "alias": alias,
        "parent": parent,
    }
    if tunable is not None:
        return _submit_tuned(model, tunable, release)
    from raymodel.jobs._request import train_request

    blob, info = train_request(model, settings, spec, kind="release", more={"release": release})
    info.update(preemptible=False, epochs=settings.num_epochs)
    return submit_request("release", blob, info)


def _submit_tuned(model: Any, tunable: Any, release: dict[str, Any]) -> Job:
    """A release whose first stage tunes (the best trial's checkpoint is the candidate)."""
    from raymodel.jobs import _store
    from raymodel.jobs._request import tune_payload, why_not_durable

    settings = dataclasses.replace(tunable.settings, name=tunable.name)
    job_id = _store.new_id("release")
    payload = {**tune_payload(model, tunable, settings, job_id, resume=False), "release": release}
    return submit_payload(
        "release",
        model,
        payload,
        tunable.trial_needs,
        settings,
        tunable.settings.max_epochs,
        id=job_id,
        preemptible=False,
        not_durable=why_not_durable(tunable.spec),
    )


def _held_out(model: Any, spec: Any, gate: Gate) -> Any:
    """The data the gate scores on: ``gate.data`` whole (as the ``valid`` split), or ``None`` for the
    release's own ``valid`` split, which must then be there."""
    from raymodel.data import DataSpec, resolve

    if not model.backend.needs_data:
        if gate.data is not None:
            raise DataError(f"`{type(model).__name__}` is scored on episodes of its env; leave `gate.data` out.")
        return None
    if gate.data is not None:
        held = resolve(model.backend.prepare_data(model, gate.data))
        splits = dict(held.splits)
        if "valid" not in splits:
            splits["valid"] = splits["train"]  # all of it is held out
        return DataSpec(splits=splits, module=held.module, module_blob=held.module_blob)
    if spec.has_validation is False:
        raise DataError(
            "The gate scores the candidate and `against` on held-out data: give data with a `valid` split "
            "(`rm.data.from_numpy(X, y, valid_fraction=0.2)`, or `{'train': ..., 'valid': ...}`), or the "
            "gate's own: `rm.Gate(..., data=...)`."
        )
    return None


def _check_against(model: Any, gate: Gate, key: str, registry_uri: str) -> None:
    """``against`` is a version of the key the release registers under; a number names one that exists;
    an alias not set yet (or a key with no versions) is a first release. The gate's metric is one its
    version was trained reporting."""
    from raymodel._internal import name_rules
    from raymodel.exceptions import RegistryError
    from raymodel.registry import Registry

    if gate.against is None:
        return
    against_key, version = name_rules.parse_ref(gate.against)
    if against_key != key:
        raise SettingsError(
            f"`gate.against={gate.against!r}` is a version of `{against_key}`; a release registers `{key}`, "
            f"and its gate compares it with a version of the same key (e.g. '{key}@production')."
        )
    registry = Registry(registry_uri)
    try:
        record = registry.show(key, version)
    except RegistryError as exc:
        if isinstance(version, int):  # a number that names no version: a typo, not a first release
            raise SettingsError(f"`gate.against={gate.against!r}` names no version: {exc}") from None
        return  # no such alias (or no version of the key) yet: the first release
    known = EPISODE_FIGURES if not model.backend.needs_data else tuple(sorted(record.metrics))
    if known and gate.metric not in known:
        raise SettingsError(
            f"`gate.metric={gate.metric!r}` is not a figure `{type(model).__name__}` reports; "
            f"{gate.against} ({key}:{record.version}) reports: {', '.join(known)}."
        )


def _check_route(model: Any, route: str, key: str) -> None:
    """The route serves one version of ``key`` by a registry reference (a rollout starts from it), and
    the model can be served there."""
    from raymodel._ray import cluster, remote
    from raymodel.serve import Servable, served_spec

    Servable(model, route)  # the model's schemas and serving checks, nothing deployed
    if remote.active() is not None:  # off the cluster: the cluster's Serve says
        spec = remote.call(_served_spec_here, route)
    else:
        cluster.ensure_ray(False)  # raymodel's cluster (asked with no Ray up, Serve would start a bare one)
        spec = served_spec(route)
    if spec is None:
        raise SettingsError(
            f"`route={route!r}` is not served; serve the version in production there first: "
            f"`rm.Servable('{key}@production', '{route}').deploy()` (or `raymodel serve {key}@production "
            f"--route {route}`), or leave `route` out to release without a rollout."
        )
    split = spec.plan.split or {}
    served_keys = sorted({ref.split("@")[0].split(":")[0] for ref in split})
    if served_keys != [key]:
        raise SettingsError(f"`route={route!r}` serves {', '.join(served_keys)}; a release of `{key}` rolls out there.")


def _served_spec_here(route: str) -> Any:
    """On the cluster: what serves ``route`` (``served_spec``)."""
    from raymodel._ray import cluster
    from raymodel.serve import served_spec

    cluster.ensure_ray(False)
    return served_spec(route)


def follow(job: Job) -> ReleaseResult:
    """Print a release's rows as they come (a line per epoch, one per stage), then its result."""
    name = job.id
    for row in job.stream():
        if "end" not in row:  # a training epoch
            shown = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "epoch"}
            print(f"{name} train epoch {row.get('epoch')}: " + "  ".join(f"{k} {v:.4g}" for k, v in shown.items()))
        else:
            print(f"{name} {describe(row)}")
    result: ReleaseResult = job.wait()
    print(f"{name} {result.status}: {result.reason}")
    return result
