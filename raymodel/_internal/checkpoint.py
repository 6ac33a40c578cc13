"""The one checkpoint format of every backend.

A checkpoint is a directory::

    raymodel.json      manifest: class reference, backend, config, versions,
                       epoch, metrics, history, and the sha256 of every file
    class.pkl          the model class and its config, cloudpickled by value
    state/...          the backend's own state files (torch.save, Keras, booster)

The manifest is written last, after every other file, so a directory without
it is not a checkpoint. Loading verifies every checksum before anything is
unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from raymodel._internal import serialization
from raymodel.exceptions import CheckpointError, ChecksumError

MANIFEST = "raymodel.json"
CLASS_FILE = "class.pkl"
STATE_DIR = "state"
FORMAT = "raymodel-checkpoint"
FORMAT_VERSION = 1

_TRACKED_PACKAGES = ("raymodel", "ray", "cloudpickle", "numpy", "torch", "pytorch-lightning",
                     "tensorflow", "keras", "xgboost", "lightgbm")


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def library_versions(backend_packages: tuple[str, ...] = ()) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in (*_TRACKED_PACKAGES, *backend_packages):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def jsonable(value: Any) -> Any:
    """Best-effort JSON view of configs and metrics (numpy scalars, tuples, paths)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item") and callable(value.item):
        with contextlib.suppress(Exception):
            return value.item()
    return repr(value)


def write(model: Any, directory: str | Path, state: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (class, config) and its backend ``state`` as a checkpoint into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cls = type(model)
    with open(directory / CLASS_FILE, "wb") as fh:
        fh.write(serialization.dumps({"class": cls, "config": dict(model.config)}, cls))
    state_dir = directory / STATE_DIR
    state_dir.mkdir(exist_ok=True)
    model.backend.write_state(model, state, state_dir)
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            files[path.relative_to(directory).as_posix()] = sha256(path)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "class": {"module": cls.__module__, "qualname": cls.__qualname__},
        "backend": model.backend.name,
        "config": jsonable(dict(model.config)),
        "versions": library_versions(model.backend.packages),
        "created": time.time(),
        **jsonable(extra or {}),
        "files": files,
    }
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, directory / MANIFEST)
    return directory


def read_manifest(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise CheckpointError(f"Checkpoint directory `{directory}` does not exist.")
    if not path.is_file():
        raise CheckpointError(
            f"`{directory}` is not a raymodel checkpoint: it has no `{MANIFEST}`. "
            "Pass the folder that `train()` returned as `.checkpoint`, or one written by `model.save()`."
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot read the manifest `{path}`: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"`{path}` is not a raymodel manifest (format={manifest.get('format')!r}).")
    return manifest


def verify(directory: str | Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check every file against the manifest's sha256; raise :class:`ChecksumError` on a mismatch."""
    directory = Path(directory)
    manifest = manifest or read_manifest(directory)
    for rel, expected in manifest.get("files", {}).items():
        path = directory / rel
        if not path.is_file():
            raise ChecksumError(f"Checkpoint `{directory}` is missing `{rel}`, listed in its manifest.")
        actual = sha256(path)
        if actual != expected:
            raise ChecksumError(
                f"Checksum mismatch for `{rel}` in checkpoint `{directory}`: the manifest says "
                f"sha256 {expected[:12]}..., the file has {actual[:12]}.... The file was changed "
                "or corrupted after it was written; nothing was loaded."
            )
    return manifest


def load_class(directory: str | Path, manifest: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """Unpickle the model class and config (call only after :func:`verify`)."""
    with open(Path(directory) / CLASS_FILE, "rb") as fh:
        payload = serialization.loads(fh.read())
    return payload["class"], payload["config"]


@contextlib.contextmanager
def local_copy(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a local directory for ``path``, downloading it first when it is a URI."""
    text = os.fspath(path)
    if "://" not in text or text.startswith("file://"):
        yield Path(text.removeprefix("file://"))
        return
    from ray.train import Checkpoint

    tmp = tempfile.mkdtemp(prefix="raymodel-ckpt-")
    try:
        Checkpoint(text).to_directory(tmp)
        yield Path(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
