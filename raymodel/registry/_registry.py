"""A versioned model store kept in storage, not in a server's memory."""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

from raymodel._internal import locations, name_rules, storage, tmp
from raymodel.contract import checkpoint as ckpt
from raymodel.exceptions import RegistryError
from raymodel.registry._checks import check_json, os_errors
from raymodel.registry._store import RECORD, TOMBSTONE


@dataclasses.dataclass(frozen=True)
class ModelRef:
    """A registry entry: ``key`` and ``version``."""

    key: str
    version: int

    def __str__(self) -> str:
        return f"{self.key}:{self.version}"


@dataclasses.dataclass(frozen=True)
class ModelRecord:
    """What the registry knows of one version."""

    key: str
    version: int
    aliases: list[str]
    created: float
    metrics: dict[str, Any]
    metadata: dict[str, Any]
    lineage: dict[str, Any]
    model_class: str
    backend: str

    @property
    def created_iso(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))


def _named(key: Any, version: int | str | None) -> tuple[str, int | str | None]:
    """``(key, version)`` of what ``get``/``show``/``resolve`` were given: a ``ModelRef``, ``"key:N"``,
    ``"key@alias"``, or a bare key and a version."""
    if isinstance(key, ModelRef):
        named: tuple[str, int | str | None] = (key.key, key.version)
    elif isinstance(key, str) and (":" in key or "@" in key):
        named = name_rules.parse_ref(key)
    else:
        return key, version
    if version is not None:
        raise RegistryError(
            f"{str(key)!r} names its version already; pass `version` only with a bare key (got version={version!r})."
        )
    return named


class Registry:
    """A registry rooted at a local folder or a ``pyarrow.fs`` URI (layout: ``_store.py``).

    Guarantees: a version appears whole or not at all; version numbers only go
    up (a deleted number is never handed out again); a ``put`` with an alias
    publishes both or neither; every key, alias and version is checked by one
    function (``raymodel._internal.name_rules``) before any path is built; a
    corrupt record spoils only its own version.
    """

    def __init__(self, uri: str) -> None:
        from raymodel.registry._store import Store

        self.uri = uri
        self.store = Store(uri)

    # ------------------------------------------------------------------ put
    @os_errors
    def put(
        self,
        obj: Any,
        key: str,
        alias: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        lineage: Mapping[str, Any] | None = None,
    ) -> ModelRef:
        """Store ``obj`` as the next version of ``key``.

        Args:
            obj: A model instance, a ``TrainResult``, a ``TuneResult`` (its best
                trial) or a checkpoint path.
            key: Name of the model, e.g. ``"digits"``.
            alias: Point this alias (e.g. ``"production"``) at the new version.
            metadata: Your own JSON-able notes, kept with the version.
            lineage: More of where it came from, kept in its lineage, e.g.
                ``{"parent": "digits:3"}`` (what a job by reference records).

        Returns:
            ``ModelRef(key, version)``; versions count 1, 2, 3, ... per key and are never reused.
        """
        name_rules.key(key)
        if alias is not None:
            name_rules.alias(alias)
        check_json("metadata", metadata)
        check_json("lineage", lineage)
        lineage_more = lineage
        with tmp.tempdir("put") as staging:
            source, lineage = _materialize(obj, staging)
            manifest = ckpt.verify(source)  # never publish a corrupt checkpoint
            record = {
                "key": key,
                "created": time.time(),
                "metrics": ckpt.plain_json(lineage.pop("metrics", None) or manifest.get("metrics") or {}),
                "metadata": ckpt.plain_json(dict(metadata or {})),
                "lineage": ckpt.plain_json(
                    {
                        "config": manifest.get("config"),
                        **({"adapter_of": manifest["adapter_of"]} if manifest.get("adapter_of") else {}),
                        **({"parent": parent} if (parent := (manifest.get("run") or {}).get("parent")) else {}),
                        **lineage,
                        **dict(lineage_more or {}),
                    }
                ),
                "model_class": f"{manifest['class']['module']}.{manifest['class']['qualname']}",
                "backend": manifest.get("backend"),
            }
            version = self.store.publish(source, key, record)
        if alias is not None:
            try:
                self.set_alias(key, alias, version)
            except BaseException:
                self.store.tombstone(key, version)  # all or nothing: the version goes with its alias
                raise
        return ModelRef(key, version)

    # ------------------------------------------------------------------ get
    @os_errors
    def get(
        self, key: str | ModelRef, version: int | str | None = None, config: Mapping[str, Any] | None = None
    ) -> Any:
        """Load a version as a model instance with its weights.

        Args:
            key: The key (``"digits"``), or a whole reference: what ``put`` returns (a ``ModelRef``),
                ``"digits:3"`` or ``"digits@production"``.
            version: With a bare key: ``None`` (the newest), a version number, or an alias.
            config: Entries merged over the stored config (e.g. inference-only options).
        """
        key, version = _named(key, version)
        n = self.resolve(key, version)
        self._record(key, n, {})  # a corrupt record is named before anything is loaded
        with tmp.tempdir("get") as staging:
            directory = self.store.fetch(f"{key}/versions/{n}", staging / "v")
            model = ckpt.load_model(directory, config=dict(config or {}))
        model.source = {"registry": f"{key}:{n}", "uri": self.uri}
        return model

    @os_errors
    def location(self, key: str | ModelRef, version: int | str | None = None) -> str:
        """Where a version's checkpoint folder is (a local path, or a URI under the registry's): what a
        run reads it from (``raymodel.train``'s scoring of a release's ``against``)."""
        key, version = _named(key, version)
        rel = f"{key}/versions/{self.resolve(key, version)}"
        return str(self.store.path(rel)) if self.store.local else storage.join(self.uri, rel)

    @os_errors
    def resolve(self, key: str | ModelRef, version: int | str | None = None) -> int:
        """The version number that ``version`` (None, int or alias) names; ``key`` may be a whole
        reference, as for ``get``."""
        key, version = _named(key, version)
        name_rules.key(key)
        wanted = name_rules.version(version)
        versions = self._versions(key)
        if not versions:
            keys = self.keys()
            raise RegistryError(
                f"No model `{key}` in the registry at `{self.uri}`. Keys: {', '.join(keys) if keys else '(none yet)'}."
            )
        if wanted is None:
            return max(versions)
        if isinstance(wanted, int):
            if wanted not in versions:
                raise RegistryError(f"`{key}` has no version {wanted}; versions: {_ranges(versions)}.")
            return wanted
        aliases = self._aliases(key)
        if wanted not in aliases:
            known = ", ".join(f"{a}->{v}" for a, v in sorted(aliases.items())) or "(none)"
            raise RegistryError(f"`{key}` has no alias `{wanted}`; aliases: {known}.")
        if aliases[wanted] not in versions:
            raise RegistryError(f"`{key}@{wanted}` points at version {aliases[wanted]}, which was deleted.")
        return aliases[wanted]

    # ----------------------------------------------------------------- list
    @os_errors
    def keys(self) -> builtins.list[str]:
        return [k for k in self.store.listdir("") if name_rules.name_problem(k, "") is None and self._versions(k)]

    @os_errors
    def list(self, key: str | None = None) -> builtins.list[ModelRecord]:
        """Records of every version (of ``key``, or of every key), oldest first.

        A version whose record cannot be read is left out with a warning naming its file.
        """
        if key is not None:
            self.resolve(key)  # raises, naming the keys that exist
        records = []
        for k in [key] if key is not None else self.keys():
            aliases = self._aliases(k)  # one listing and one alias read per key, not per version
            for n in self._versions(k):
                try:
                    records.append(self._record(k, n, aliases))
                except RegistryError as exc:
                    warnings.warn(f"Skipping `{k}:{n}`: {exc}", RuntimeWarning, stacklevel=2)
        return records

    @os_errors
    def show(self, key: str | ModelRef, version: int | str | None = None) -> ModelRecord:
        """What the registry knows of a version; ``key`` may be a whole reference, as for ``get``."""
        key, version = _named(key, version)
        return self._record(key, self.resolve(key, version), self._aliases(key))

    def _record(self, key: str, n: int, aliases: dict[str, int]) -> ModelRecord:
        rel = f"{key}/versions/{n}/{RECORD}"
        try:
            raw = self.store.read_json(rel)
        except FileNotFoundError as exc:
            raise RegistryError(f"`{key}:{n}` has no record (`{self.store.describe(rel)}`).") from exc
        try:
            return ModelRecord(
                key=key,
                version=n,
                aliases=sorted(a for a, v in aliases.items() if v == n),
                created=float(raw.get("created", 0.0)),
                metrics=dict(raw.get("metrics", {})),
                metadata=dict(raw.get("metadata", {})),
                lineage=dict(raw.get("lineage", {})),
                model_class=str(raw.get("model_class", "?")),
                backend=str(raw.get("backend", "?")),
            )
        except (AttributeError, TypeError, ValueError) as exc:
            raise RegistryError(f"`{self.store.describe(rel)}` is corrupt: {exc}") from exc

    # -------------------------------------------------------------- changes
    @os_errors
    def set_alias(self, key: str, alias: str, version: int | str) -> None:
        name_rules.key(key), name_rules.alias(alias), name_rules.version(version)
        with self.store.lock(key):
            n = self.resolve(key, version)
            self._migrate_aliases(key)
            self.store.write_text(f"{key}/aliases/{alias}.json", json.dumps({"version": n}))
            if not self.store.local and self.store.exists(f"{key}/versions/{n}/{TOMBSTONE}"):
                # No lock on an object store: a delete of <n> that raced this write wins.
                self.store.delete_file(f"{key}/aliases/{alias}.json")
                raise RegistryError(f"`{key}:{n}` was deleted while `{alias}` was being set; nothing changed.")

    @os_errors
    def remove_alias(self, key: str, alias: str) -> None:
        name_rules.key(key), name_rules.alias(alias)
        with self.store.lock(key):
            if alias not in self._aliases(key):
                self.resolve(key, alias)  # raises, naming the aliases that exist
            self._migrate_aliases(key)
            self.store.delete_file(f"{key}/aliases/{alias}.json")

    @os_errors
    def delete(self, key: str, version: int | str) -> None:
        """Delete one version (and the aliases pointing at it); its number is never reused."""
        name_rules.key(key), name_rules.version(version)
        with self.store.lock(key):
            n = self.resolve(key, version)
            self._migrate_aliases(key)
            for alias, target in self._aliases(key).items():
                if target == n:
                    self.store.delete_file(f"{key}/aliases/{alias}.json")
            self.store.tombstone(key, n)

    # -------------------------------------------------------------- helpers
    def _versions(self, key: str) -> builtins.list[int]:  # `list` is a method name in this class
        return [
            n
            for n in self.store.numbers(key)
            if self.store.exists(f"{key}/versions/{n}/{RECORD}")
            and not self.store.exists(f"{key}/versions/{n}/{TOMBSTONE}")
        ]

    def _aliases(self, key: str) -> dict[str, int]:
        """``{alias: version}``; an unreadable alias file is left out with a warning naming it."""
        found: dict[str, int] = {}
        legacy = self._read(f"{key}/aliases.json")  # round 1's single file
        if isinstance(legacy, dict):
            found.update({a: v for a, v in legacy.items() if isinstance(v, int) and not name_rules.name_problem(a, "")})
        for name in self.store.listdir(f"{key}/aliases"):
            alias = name.removesuffix(".json")
            if not name.endswith(".json") or name_rules.name_problem(alias, ""):
                continue
            entry = self._read(f"{key}/aliases/{name}")
            if isinstance(entry, dict) and isinstance(entry.get("version"), int):
                found[alias] = entry["version"]
        return found

    def _read(self, rel: str) -> Any:
        try:
            return self.store.read_json(rel)
        except FileNotFoundError:
            return None
        except RegistryError as exc:
            warnings.warn(str(exc), RuntimeWarning, stacklevel=3)
            return None

    def _migrate_aliases(self, key: str) -> None:
        """Move round 1's ``aliases.json`` into one file per alias (under the key's lock)."""
        legacy = self._read(f"{key}/aliases.json")
        if legacy is None:
            return
        current = set(self.store.listdir(f"{key}/aliases"))
        for alias, n in legacy.items() if isinstance(legacy, dict) else []:
            if f"{alias}.json" not in current and isinstance(n, int) and not name_rules.name_problem(alias, ""):
                self.store.write_text(f"{key}/aliases/{alias}.json", json.dumps({"version": n}))
        self.store.delete_file(f"{key}/aliases.json")

    def __repr__(self) -> str:
        return f"Registry({self.uri!r})"


def _materialize(obj: Any, staging: Path) -> tuple[Path, dict[str, Any]]:
    """A local checkpoint folder for ``obj`` and what is known of where it came from."""
    from raymodel.train import TrainResult

    if hasattr(obj, "backend") and callable(getattr(obj, "save", None)):  # a model instance
        return Path(obj.save(staging / "ckpt")), {"source": dict(obj.source)}
    if isinstance(obj, TrainResult):
        if obj.checkpoint is None:
            raise RegistryError("This `TrainResult` has no checkpoint to register.")
        lineage = {
            "run": obj.name,
            "run_path": obj.path,
            "checkpoint": obj.checkpoint,
            "metrics": obj.metrics,
            "epochs": len(obj.history),
        }
        return _copy(obj.checkpoint, staging), lineage
    if hasattr(obj, "best_checkpoint") and hasattr(obj, "best_trial_id"):  # a TuneResult (no Ray Tune import)
        if obj.best_checkpoint is None:
            raise RegistryError("This `TuneResult` has no best checkpoint to register.")
        lineage = {
            "experiment_path": obj.path,
            "trial_id": obj.best_trial_id,
            "checkpoint": obj.best_checkpoint,
            "metrics": obj.best_metrics,
            "tuned_metric": obj.metric,
        }
        return _copy(obj.best_checkpoint, staging), lineage
    if isinstance(obj, (str, os.PathLike)):
        return _copy(os.fspath(obj), staging), {"checkpoint": os.fspath(obj)}
    raise RegistryError(
        f"`put` takes a model, a TrainResult, a TuneResult or a checkpoint path (got {type(obj).__name__})."
    )


def _copy(path: str, staging: Path) -> Path:
    target = staging / "ckpt"
    with ckpt.local_copy(path) as directory:
        ckpt.read_manifest(directory)
        shutil.copytree(directory, target)
    return target


def _ranges(versions: list[int]) -> str:
    return ", ".join(str(v) for v in sorted(versions))


def default_uri() -> str:
    """``RAYMODEL_REGISTRY``, else ``$RAYMODEL_HOME/registry``."""
    explicit = os.environ.get("RAYMODEL_REGISTRY")
    if explicit:
        return explicit
    return locations.home_path("registry")
