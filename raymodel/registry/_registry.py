"""A versioned model store kept in storage, not in a server's memory."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, List, Mapping

from raymodel._internal import checkpoint as ckpt
from raymodel._internal import runtime
from raymodel.exceptions import RegistryError

_KEY_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


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


class Registry:
    """A registry rooted at a local folder or a ``pyarrow.fs`` URI.

    Layout: ``<root>/<key>/versions/<n>/`` (a checkpoint plus ``record.json``)
    and ``<root>/<key>/aliases.json``.
    """

    def __init__(self, uri: str) -> None:
        from raymodel.registry._store import Store

        self.uri = uri
        self.store = Store(uri)

    # ------------------------------------------------------------------ put
    def put(self, obj: Any, key: str, alias: str | None = None,
            metadata: Mapping[str, Any] | None = None) -> ModelRef:
        """Store ``obj`` as the next version of ``key``.

        Args:
            obj: A model instance, a ``TrainResult``, a ``TuneResult`` (its best
                trial) or a checkpoint path.
            key: Name of the model, e.g. ``"digits"``.
            alias: Point this alias (e.g. ``"production"``) at the new version.
            metadata: Your own JSON-able notes, kept with the version.

        Returns:
            ``ModelRef(key, version)``; versions count 1, 2, 3, ... per key.
        """
        _check_key(key)
        if alias is not None:
            _check_alias(alias)
        with tempfile.TemporaryDirectory(prefix="raymodel-put-") as tmp:
            source, lineage = _materialize(obj, Path(tmp))
            manifest = ckpt.verify(source)  # never publish a corrupt checkpoint
            record = {
                "key": key,
                "created": time.time(),
                "metrics": ckpt.jsonable(lineage.pop("metrics", None) or manifest.get("metrics") or {}),
                "metadata": ckpt.jsonable(dict(metadata or {})),
                "lineage": ckpt.jsonable({"config": manifest.get("config"), **lineage}),
                "model_class": f"{manifest['class']['module']}.{manifest['class']['qualname']}",
                "backend": manifest.get("backend"),
            }
            versions = self._versions(key)
            version = self.store.publish(source, key, (max(versions) + 1) if versions else 1, record)
        if alias is not None:
            self.set_alias(key, alias, version)
        return ModelRef(key, version)

    # ------------------------------------------------------------------ get
    def get(self, key: str, version: int | str | None = None, config: Mapping[str, Any] | None = None) -> Any:
        """Load a version as a model instance with its weights.

        Args:
            version: ``None`` (the newest), a version number, or an alias.
            config: Entries merged over the stored config (e.g. inference-only options).
        """
        from raymodel.model import RayModel

        n = self.resolve(key, version)
        with tempfile.TemporaryDirectory(prefix="raymodel-get-") as tmp:
            directory = self.store.fetch(f"{key}/versions/{n}", Path(tmp) / "v")
            model = RayModel.from_checkpoint(directory, config=config)
        model.source = {"registry": f"{key}:{n}", "uri": self.uri}
        return model

    def resolve(self, key: str, version: int | str | None = None) -> int:
        """The version number that ``version`` (None, int or alias) names."""
        versions = self._versions(key)
        if not versions:
            keys = self.keys()
            raise RegistryError(f"No model `{key}` in the registry at `{self.uri}`. "
                                f"Keys: {', '.join(keys) if keys else '(none yet)'}.")
        if version is None:
            return max(versions)
        if isinstance(version, bool):
            raise RegistryError(f"`version` must be an int, an alias or None (got {version!r}).")
        if isinstance(version, int) or (isinstance(version, str) and version.isdigit()):
            if int(version) not in versions:
                raise RegistryError(f"`{key}` has no version {version}; versions: {_ranges(versions)}.")
            return int(version)
        aliases = self._aliases(key)
        if version not in aliases:
            known = ", ".join(f"{a}->{v}" for a, v in sorted(aliases.items())) or "(none)"
            raise RegistryError(f"`{key}` has no alias `{version}`; aliases: {known}.")
        return int(aliases[version])

    # ----------------------------------------------------------------- list
    def keys(self) -> List[str]:
        return [k for k in self.store.listdir("") if not k.startswith(".") and self._versions(k)]

    def list(self, key: str | None = None) -> List[ModelRecord]:
        """Records of every version (of ``key``, or of every key), oldest first."""
        if key is not None:
            _check_key(key)
            self.resolve(key)  # raises, naming the keys that exist
        records = []
        for k in [key] if key is not None else self.keys():
            aliases = self._aliases(k)  # one listing and one alias read per key, not per version
            records += [self._record(k, n, aliases) for n in sorted(self._versions(k))]
        return records

    def show(self, key: str, version: int | str | None = None) -> ModelRecord:
        return self._record(key, self.resolve(key, version), self._aliases(key))

    def _record(self, key: str, n: int, aliases: dict[str, int]) -> ModelRecord:
        raw = self.store.read_json(f"{key}/versions/{n}/record.json", {})
        return ModelRecord(key=key, version=n, aliases=sorted(a for a, v in aliases.items() if int(v) == n),
                           created=raw.get("created", 0.0),
                           metrics=raw.get("metrics", {}), metadata=raw.get("metadata", {}),
                           lineage=raw.get("lineage", {}), model_class=raw.get("model_class", "?"),
                           backend=raw.get("backend", "?"))

    # -------------------------------------------------------------- changes
    def set_alias(self, key: str, alias: str, version: int | str) -> None:
        _check_alias(alias)
        n = self.resolve(key, version)
        aliases = self._aliases(key)
        aliases[alias] = n
        self.store.write_text(f"{key}/aliases.json", _dumps(aliases))

    def remove_alias(self, key: str, alias: str) -> None:
        aliases = self._aliases(key)
        if alias not in aliases:
            self.resolve(key, alias)  # raises, naming the aliases that exist
        del aliases[alias]
        self.store.write_text(f"{key}/aliases.json", _dumps(aliases))

    def delete(self, key: str, version: int | str) -> None:
        """Delete one version (and the aliases pointing at it)."""
        n = self.resolve(key, version)
        aliases = {a: v for a, v in self._aliases(key).items() if int(v) != n}
        self.store.write_text(f"{key}/aliases.json", _dumps(aliases))
        self.store.delete(f"{key}/versions/{n}")

    # -------------------------------------------------------------- helpers
    def _versions(self, key: str) -> List[int]:  # `list` is a method name in this class
        names = self.store.listdir(f"{key}/versions")
        return [int(n) for n in names if n.isdigit() and self.store.exists(f"{key}/versions/{n}/record.json")]

    def _aliases(self, key: str) -> dict[str, int]:
        return dict(self.store.read_json(f"{key}/aliases.json", {}) or {})

    def __repr__(self) -> str:
        return f"Registry({self.uri!r})"


def _materialize(obj: Any, tmp: Path) -> tuple[Path, dict[str, Any]]:
    """A local checkpoint folder for ``obj`` and what is known of where it came from."""
    from raymodel.model import RayModel
    from raymodel.train import TrainResult

    if isinstance(obj, RayModel):
        return Path(obj.save(tmp / "ckpt")), {"source": dict(obj.source)}
    if isinstance(obj, TrainResult):
        if obj.checkpoint is None:
            raise RegistryError("This `TrainResult` has no checkpoint to register.")
        lineage = {"run": obj.name, "run_path": obj.path, "checkpoint": obj.checkpoint, "metrics": obj.metrics,
                   "epochs": len(obj.history)}
        return _copy(obj.checkpoint, tmp), lineage
    if type(obj).__name__ == "TuneResult" and hasattr(obj, "best_checkpoint"):
        if obj.best_checkpoint is None:
            raise RegistryError("This `TuneResult` has no best checkpoint to register.")
        lineage = {"experiment_path": obj.path, "trial_id": obj.best_trial_id, "checkpoint": obj.best_checkpoint,
                   "metrics": obj.best_metrics, "tuned_metric": obj.metric}
        return _copy(obj.best_checkpoint, tmp), lineage
    if isinstance(obj, (str, os.PathLike)):
        return _copy(os.fspath(obj), tmp), {"checkpoint": os.fspath(obj)}
    raise RegistryError(f"`put` takes a model, a TrainResult, a TuneResult or a checkpoint path "
                        f"(got {type(obj).__name__}).")


def _copy(path: str, tmp: Path) -> Path:
    target = tmp / "ckpt"
    with ckpt.local_copy(path) as directory:
        ckpt.read_manifest(directory)
        shutil.copytree(directory, target)
    return target


def _check_key(key: Any) -> None:
    if not isinstance(key, str) or not key or key.startswith(".") or set(key) - _KEY_CHARS:
        raise RegistryError(f"A registry key is a non-empty name of letters, digits, '_', '-' and '.' "
                            f"(got {key!r}).")


def _check_alias(alias: Any) -> None:
    if not isinstance(alias, str) or not alias or alias.isdigit() or set(alias) - _KEY_CHARS:
        raise RegistryError(f"An alias is a name of letters, digits, '_', '-' and '.', not a number (got {alias!r}).")


def _ranges(versions: list[int]) -> str:
    return ", ".join(str(v) for v in sorted(versions))


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2, sort_keys=True)


def default_uri() -> str:
    """``RAYMODEL_REGISTRY``, else ``$RAYMODEL_HOME/registry``."""
    explicit = os.environ.get("RAYMODEL_REGISTRY")
    if explicit:
        return explicit
    home = runtime.home()
    return f"{home}/registry"
