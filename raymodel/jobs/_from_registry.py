"""Train and tune by reference: ``rm.jobs.submit("digits@production", "train", ...)`` and
``raymodel train|tune REF``. A job on the training server that starts from a registry version
(its weights and config), and registers what it makes, with that version in its lineage."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Mapping

from raymodel import data as data_forms
from raymodel._internal import name_rules
from raymodel.exceptions import DataError, SettingsError

KINDS = ("train", "tune", "release")


def resolve(
    ref: str, kind: str, data: Any, config: Mapping[str, Any] | None, register: str | None, registry: str | None
) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, data, extra)`` of a job by reference (``rm.jobs.submit``), every check first: the kind,
    the reference, the config keys, the name to register under, the data. The model is the version's
    (its weights and config, ``config`` merged over); ``extra`` is what the server needs to register."""
    from raymodel.registry import Registry, default_uri

    if kind not in KINDS:
        raise SettingsError(f"`kind` must be 'train', 'tune' or 'release' (got {kind!r}).")
    key, version = name_rules.parse_ref(ref)
    registry_uri = registry or default_uri()
    reg = Registry(registry_uri)
    record = reg.show(key, version)  # raises, naming the versions and aliases that exist
    n = record.version
    check_config_keys(config or {}, record.lineage.get("config") or {}, f"`{key}:{n}`")
    target = check_register(register) if register is not None else None
    data = load_data(data)
    model = reg.get(key, n, config=dict(config or {}))
    wanted = None if target is None else {"registry": registry_uri, "key": target[0], "alias": target[1]}
    return model, data, {"register": wanted and {**wanted, "parent": f"{key}:{n}"}}


def check_register(text: Any) -> tuple[str, str | None]:
    """``"digits"`` or ``"digits@candidate"`` -> ``(key, alias)``; a version number cannot be chosen."""
    if not isinstance(text, str) or ":" in text:
        raise SettingsError(
            f"`register` is KEY or KEY@ALIAS, e.g. 'digits@candidate'; the registry numbers versions "
            f"itself (got {text!r})."
        )
    key, alias = name_rules.parse_ref(text)
    return key, alias if isinstance(alias, str) else None


def load_data(data: Any) -> Any:
    """The data a ``"package.module:OBJECT"`` string names (a function there is called, a class is
    instantiated: a data module), checked (``rm.data.resolve``); any other ``data`` as it is."""
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
    if inspect.isclass(obj):  # a data module class, as Lightning's DataModule: an instance of it
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - any failure of the user's constructor, named
            raise DataError(
                f"`data` {data!r} names the class `{obj.__name__}`, which raymodel instantiates without "
                f"arguments, and `{obj.__name__}()` failed: {type(exc).__name__}: {exc}. Give its arguments "
                "defaults, or name a function that returns the data."
            ) from None
    elif inspect.isfunction(obj):
        obj = obj()
    return data_forms.resolve(obj)  # checked here: data that cannot work is refused before anything is submitted


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


def register_result(
    job_id: str, kind: str, wanted: dict[str, Any], result: dict[str, Any]
) -> tuple[str | None, str | None]:
    """On the server, a succeeded job's ``register`` (``wanted``: its registry, key, alias and parent):
    ``("digits:4", None)`` or ``(None, error)``."""
    from raymodel.registry import Registry

    try:
        if kind == "train":
            from raymodel.train import TrainResult

            outcome: Any = TrainResult(**result)
        else:
            from raymodel.tune import TuneResult

            outcome = TuneResult(**result)
        made = Registry(wanted["registry"]).put(
            outcome, wanted["key"], wanted["alias"], lineage={"parent": wanted["parent"], "job": job_id}
        )
    except Exception as exc:  # noqa: BLE001 - the job's error: it trained, and could not be registered
        return None, f"trained, but could not be registered as `{wanted['key']}`: {type(exc).__name__}: {exc}"
    return str(made), None
