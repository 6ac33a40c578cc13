"""Train and tune by reference: ``rm.jobs.submit("digits@production", "train", ...)`` and
``raymodel train|tune REF``. A job on the training server that starts from a registry version
(its weights and config), and registers what it makes, with that version in its lineage."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Mapping

from raymodel._internal import names
from raymodel.exceptions import DataError, SettingsError

KINDS = ("train", "tune")


def submit(
    ref: str,
    kind: str = "train",
    *,
    settings: Any = None,
    data: Any = None,
    config: Mapping[str, Any] | None = None,
    space: Mapping[str, Any] | None = None,
    register: str | None = None,
    registry: str | None = None,
) -> Any:
    """Train (or tune) the registry version ``ref`` names, as a job of the training server.

    Every check runs first, in this process: the reference, the data, the settings and config
    keys, the name to register under; nothing is queued if one fails.

    Args:
        ref: ``"digits@production"``, ``"digits:3"`` or ``"digits"`` (the newest version).
        kind: ``"train"`` (further, from the version's weights) or ``"tune"`` (from its config,
            over ``space`` or the model's ``hyperparameter_space``).
        settings: ``TrainSettings`` (``TuneSettings`` for ``"tune"``) or a dict of their fields.
        data: What ``model.train`` takes, or ``"package.module:OBJECT"`` naming it (a function
            there is called, with no arguments, for the data).
        config: Entries merged over the version's config.
        space: The search space of a tune job.
        register: ``"KEY"`` or ``"KEY@ALIAS"``: when the job succeeds, its final checkpoint (a tune
            job's best trial's) becomes the next version of ``KEY`` (and ``ALIAS`` points at it);
            its lineage's ``parent`` names the version it started from. The record's
            ``registered`` says which version it made.
        registry: The registry's URI (default: ``RAYMODEL_REGISTRY`` or ``$RAYMODEL_HOME/registry``).

    Returns:
        The ``Job``; ``job.wait()`` gives the ``TrainResult`` or ``TuneResult``.
    """
    from raymodel.registry import Registry, default_uri

    if kind not in KINDS:
        raise SettingsError(f"`kind` must be 'train' or 'tune' (got {kind!r}).")
    key, version = names.parse_ref(ref)
    registry_uri = registry or default_uri()
    reg = Registry(registry_uri)
    record = reg.show(key, version)  # raises, naming the versions and aliases that exist
    n = record.version
    check_config_keys(config or {}, record.lineage.get("config") or {}, f"`{key}:{n}`")
    target = check_register(register) if register is not None else None
    data = load_data(data)
    model = reg.get(key, n, config=dict(config or {}))
    extra = {
        "register": None
        if target is None
        else {"registry": registry_uri, "key": target[0], "alias": target[1], "parent": f"{key}:{n}"}
    }
    from raymodel.jobs import _submit_checked, submit_tune

    if kind == "train":
        from raymodel.train import prepare

        checked, spec = prepare(model, settings, data)
        return _submit_checked(model, checked, spec, extra=extra)
    return submit_tune(model, space, settings, data, False, extra=extra)


def check_register(text: Any) -> tuple[str, str | None]:
    """``"digits"`` or ``"digits@candidate"`` -> ``(key, alias)``; a version number cannot be chosen."""
    if not isinstance(text, str) or ":" in text:
        raise SettingsError(
            f"`register` is KEY or KEY@ALIAS, e.g. 'digits@candidate'; the registry numbers versions "
            f"itself (got {text!r})."
        )
    key, alias = names.parse_ref(text)
    return key, alias if isinstance(alias, str) else None


def load_data(data: Any) -> Any:
    """The data a ``"package.module:OBJECT"`` string names (a function there is called), else ``data``."""
    if not isinstance(data, str):
        return data
    module_name, sep, attr = data.partition(":")
    if not sep or not module_name or not attr:
        raise DataError(f"`data` {data!r}: name it as package.module:OBJECT, e.g. 'mypkg.data:digits'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DataError(
            f"`data` {data!r}: cannot import `{module_name}` ({exc}); is it on PYTHONPATH here and on the cluster?"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(
                n for n in dir(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))
            )
            raise DataError(f"`data` {data!r}: `{module_name}` has no `{attr}`; it has: {', '.join(public[:20])}.")
        obj = getattr(obj, part)
    return obj() if inspect.isfunction(obj) else obj


def check_config_keys(config: Mapping[str, Any], known: Mapping[str, Any], what: str) -> None:
    """Config entries for a version must be keys of its stored config (a typo is not a new key)."""
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise SettingsError(
            f"{', '.join(f'`{k}`' for k in unknown)}: not in the config of {what} "
            f"({', '.join(sorted(known)) or 'empty'})."
        )


def split_sets(pairs: Mapping[str, Any], kind: str, model_config: Mapping[str, Any]) -> tuple[dict, dict]:
    """``--set`` pairs -> ``(settings, config)``: a name of ``TrainSettings`` (``TuneSettings``, or
    ``train.NAME``, for tune) is a setting, a key of the version's config is config; anything else
    is a ``SettingsError`` naming both."""
    from raymodel.train import TrainSettings
    from raymodel.tune import TuneSettings

    fields = {f.name for f in dataclasses.fields(TrainSettings if kind == "train" else TuneSettings)}
    train_fields = {f.name for f in dataclasses.fields(TrainSettings)}
    settings: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for name, value in pairs.items():
        if name in fields:
            settings[name] = value
        elif kind == "tune" and name.startswith("train.") and name[len("train.") :] in train_fields:
            settings.setdefault("train", {})[name[len("train.") :]] = value
        elif name in model_config:
            config[name] = value
        else:
            raise SettingsError(
                f"`--set {name}=...`: `{name}` is neither a {'TrainSettings' if kind == 'train' else 'TuneSettings'} "
                f"field nor a key of the model's config ({', '.join(sorted(model_config)) or 'empty'})."
            )
    return settings, config


def register_result(record: dict[str, Any], result: dict[str, Any]) -> tuple[str | None, str | None]:
    """On the server, a succeeded job's ``register``: ``("digits:4", None)`` or ``(None, error)``."""
    from raymodel.registry import Registry

    wanted = record["register"]
    try:
        if record["kind"] == "train":
            from raymodel.train import TrainResult

            outcome: Any = TrainResult(**result)
        else:
            from raymodel.tune import TuneResult

            outcome = TuneResult(**result)
        made = Registry(wanted["registry"]).put(
            outcome, wanted["key"], wanted["alias"], lineage={"parent": wanted["parent"], "job": record["id"]}
        )
    except Exception as exc:  # noqa: BLE001 - the job's error: it trained, and could not be registered
        return None, f"trained, but could not be registered as `{wanted['key']}`: {type(exc).__name__}: {exc}"
    return str(made), None
