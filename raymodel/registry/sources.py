"""Resolving references: where a served or batch-scoring model comes from, a checkpoint or a
version of a registry key.

A *source* is a small dict that travels to Ray actors (Serve replicas, Ray Data
actors) instead of the model itself; each actor loads the model once from it.
The drivers that load models (``serve/``, ``predict/``) sit above the registry
and call these.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

from raymodel._internal import storage, tmp
from raymodel._internal.name_rules import parse_ref
from raymodel.registry._registry import Registry, default_uri


def registry_source(ref: str, uri: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """What an actor needs to load (and follow) a registry reference; checked now, before any actor starts.

    Returns the source and a description (class, backend, ref) of the version it names now.
    """
    key, version = parse_ref(ref)
    registry = Registry(uri or default_uri())
    record = registry.show(key, version)  # raises, naming what exists
    source = {"registry": registry.uri, "key": key, "version": version}
    return source, {"class": record.model_class, "backend": record.backend, "ref": ref, "resolved": record.version}


def is_checkpoint_path(ref: str) -> bool:
    """A reference that names a checkpoint folder (a path or a URI) rather than a registry key."""
    return storage.is_uri(ref) or os.sep in ref or ref.startswith(".")


def load(source: dict[str, Any], version: Any) -> Any:
    """The model a source names, set up: a checkpoint, or ``version`` (a number, an alias or
    ``None`` for the newest) of a registry key."""
    if "checkpoint" in source:
        from raymodel.contract import checkpoint as ckpt

        model = ckpt.load_model(source["checkpoint"])
    else:
        registry = Registry(source["registry"])
        n = registry.resolve(source["key"], version)
        model = registry.get(source["key"], n)
        model.source = {**model.source, "version": n}
    model.ensure_setup()
    return model


@contextlib.contextmanager
def version_folder(uri: str, key: str, version: int) -> Iterator[Path]:
    """A local copy of a registry version's checkpoint folder, removed after (a replica reads an
    adapter's files from it onto a base it holds already)."""
    registry = Registry(uri)
    with tmp.tempdir("version") as staging:
        yield Path(registry.store.fetch(f"{key}/versions/{int(version)}", staging / "v"))
