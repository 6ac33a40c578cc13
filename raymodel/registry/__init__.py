"""A versioned, persistent model store: ``rm.registry.put/get/list``.

The registry lives in storage (``$RAYMODEL_HOME/registry``, ``RAYMODEL_REGISTRY``,
or any ``pyarrow.fs`` URI via ``open``), so every process and cluster node
that reaches the storage sees the same models. A version appears whole or not
at all, and every file's sha256 is checked before anything is unpickled.

Loading a model runs its pickled code: only load from registries you trust.

Example:
    >>> ref = rm.registry.put(model, key="digits", alias="production")
    >>> rm.registry.get("digits", "production").serve("/digits")
"""

from __future__ import annotations

from typing import Any, Mapping

from raymodel.registry._registry import ModelRecord, ModelRef, Registry, default_uri

__all__ = [
    "put",
    "get",
    "list",
    "show",
    "delete",
    "set_alias",
    "remove_alias",
    "open",
    "Registry",
    "ModelRef",
    "ModelRecord",
]

_list = list


def open(uri: str | None = None) -> Registry:
    """A registry at ``uri`` (a folder or ``s3://``, ``gs://``, ... URI); default: ``default_uri``."""
    return Registry(uri or default_uri())


def put(obj: Any, key: str, alias: str | None = None, metadata: Mapping[str, Any] | None = None) -> ModelRef:
    """Store a model, ``TrainResult``, ``TuneResult`` or checkpoint as the next version of ``key``."""
    return open().put(obj, key, alias=alias, metadata=metadata)


def get(key: str | ModelRef, version: int | str | None = None, config: Mapping[str, Any] | None = None) -> Any:
    """Load ``key`` (newest, a version number, or an alias) as a model with weights; ``key`` may be
    what ``put`` returned (a ``ModelRef``), ``"key:N"`` or ``"key@alias"``."""
    return open().get(key, version, config=config)


def list(key: str | None = None) -> _list[ModelRecord]:
    """Records (key, version, aliases, created, metrics, metadata, lineage)."""
    return open().list(key)


def show(key: str | ModelRef, version: int | str | None = None) -> ModelRecord:
    return open().show(key, version)


def delete(key: str, version: int | str) -> None:
    open().delete(key, version)


def set_alias(key: str, alias: str, version: int | str) -> None:
    open().set_alias(key, alias, version)


def remove_alias(key: str, alias: str) -> None:
    open().remove_alias(key, alias)
