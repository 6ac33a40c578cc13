"""The one checkpoint format of every backend.

A checkpoint is a directory::

    raymodel.json      manifest: class reference, backend, config, versions,
                       epoch, metrics, history, and the sha256 of every file
    class.pkl          the model class and its config, cloudpickled by value
    state/...          the backend's own state files (torch.save, Keras, booster)
    state/extra.pkl    entries a hook added to the state (``on_save_checkpoint``)
    state/run.pkl      a training run's own state: callbacks' state, each worker's RNG

The manifest is written last, after every other file, so a directory without
it is not a checkpoint. Loading verifies every checksum before anything is
unpickled.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from raymodel._internal import serialization, tmp
from raymodel.exceptions import CheckpointError, ChecksumError, RayModelError, SettingsError

MANIFEST = "raymodel.json"
CLASS_FILE = "class.pkl"
STATE_DIR = "state"
EXTRA_FILE = "extra.pkl"
RUN_FILE = "run.pkl"
FORMAT = "raymodel-checkpoint"
FORMAT_VERSION = 2  # 2: the manifest carries its own sha256 (`manifest_sha256`)

#: Recorded in every checkpoint; each backend adds its framework's packages.
_CORE_PACKAGES = ("raymodel", "ray", "cloudpickle", "numpy")
_EPOCH_DIR = re.compile(r"^checkpoint_epoch_(\d+)$")


def epoch_of(name: str) -> int | None:
    """The epoch of a run's checkpoint folder name (``checkpoint_epoch_000003`` -> 3), else None."""
    match = _EPOCH_DIR.match(name)
    return int(match.group(1)) if match else None


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


#: Once per process: a lookup scans the package metadata (9 ms for a checkpoint's, written every epoch).
_installed_version = functools.cache(importlib.metadata.version)


def library_versions(packages: tuple[str, ...] = ()) -> dict[str, str]:
    """Python's version and those of the core packages and ``packages`` that are installed."""
    versions = {"python": platform.python_version()}
    for name in (*_CORE_PACKAGES, *packages):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = _installed_version(name)
    return versions


def plain_json(value: Any) -> Any:
    """Best-effort JSON view of configs and metrics (numpy scalars, tuples, paths)."""
    if isinstance(value, dict):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item") and callable(value.item):
        with contextlib.suppress(Exception):
            return value.item()
    return repr(value)


def write(
    model: Any,
    directory: str | Path,
    state: dict[str, Any],
    extra: dict[str, Any] | None = None,
    run_state: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (class, config) and its ``state`` as a checkpoint into ``directory``.

    The backend writes the entries it knows (``backend.state_keys``) with the
    framework's own saver; any other entry goes to ``state/extra.pkl``, and a
    training run's ``run_state`` to ``state/run.pkl``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cls = type(model)
    backend = model.backend
    with open(directory / CLASS_FILE, "wb") as fh:
        fh.write(serialization.dumps({"class": cls, "config": dict(model.config)}, cls))
    state_dir = directory / STATE_DIR
    state_dir.mkdir(exist_ok=True)
    backend.write_state(model, {k: v for k, v in state.items() if k in backend.state_keys}, state_dir)
    others = {k: v for k, v in state.items() if k not in backend.state_keys}
    if others:
        (state_dir / EXTRA_FILE).write_bytes(serialization.dumps(others, cls))
    if run_state:
        (state_dir / RUN_FILE).write_bytes(serialization.dumps(run_state, cls))
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            files[path.relative_to(directory).as_posix()] = sha256(path)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "class": {"module": cls.__module__, "qualname": cls.__qualname__},
        "backend": model.backend.name,
        "config": plain_json(dict(model.config)),
        "versions": library_versions(backend.packages),
        "input_signature": getattr(model, "input_signature", None),
        **({"adapter_of": adapter_of} if (adapter_of := getattr(model, "adapter_of", None)) else {}),
        "created": time.time(),
        **plain_json(extra or {}),
        "files": files,
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
    staged = directory / (MANIFEST + ".tmp")
    staged.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(staged, directory / MANIFEST)
    return directory


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON, without its own ``manifest_sha256`` entry."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a checkpoint folder, after a schema check; ``CheckpointError`` otherwise."""
    directory = Path(directory)
    path = directory / MANIFEST
    if directory.is_file():
        inside = f" (it is `{MANIFEST}`: pass its folder, `{directory.parent}`)" if directory.name == MANIFEST else ""
        raise CheckpointError(
            f"`{directory}` is a file; a checkpoint is a folder{inside}. Pass the folder that `train()` returned "
            "as `.checkpoint`, or one written by `model.save()`."
        )
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
    problem = _schema_problem(manifest)
    if problem:
        raise CheckpointError(f"`{path}` is not a valid raymodel manifest: {problem}. Nothing was loaded.")
    return manifest


_SHA256 = re.compile(r"[0-9a-f]{64}")
#: Files a container may keep beside a checkpoint that the loader never reads (the registry's
#: record, and its claim on the version number on an object store).
SIDECAR_FILES = frozenset({"record.json", "CLAIMED"})


def _schema_problem(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return "it is not a JSON object"
    if manifest.get("format") != FORMAT:
        return f"format is {manifest.get('format')!r}, not {FORMAT!r}"
    if manifest.get("format_version") != FORMAT_VERSION:
        return (
            f"format_version {manifest.get('format_version')!r} is not {FORMAT_VERSION} (format 1 checkpoints "
            "carry no manifest checksum; save the model again with this raymodel)"
        )
    if manifest.get("manifest_sha256") != manifest_digest(manifest):
        return "the manifest was changed after it was written (its `manifest_sha256` does not match)"
    cls = manifest.get("class")
    if not (isinstance(cls, dict) and isinstance(cls.get("module"), str) and isinstance(cls.get("qualname"), str)):
        return "`class` must name a module and a qualname"
    if not isinstance(manifest.get("backend"), str) or not isinstance(manifest.get("config"), dict):
        return "`backend` must be a string and `config` an object"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "it lists no files (`files` must map every file to its sha256)"
    for rel, digest in files.items():
        parts = rel.split("/") if isinstance(rel, str) else [""]
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            return f"the sha256 of `{rel}` is not 64 hex digits"
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in rel or "\0" in rel:
            return f"`{rel}` is not a plain relative path inside the checkpoint"
    if CLASS_FILE not in files or not any(rel.startswith(f"{STATE_DIR}/") for rel in files):
        return f"`{CLASS_FILE}` and the `{STATE_DIR}/` files must be listed"
    return None


def verify(directory: str | Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check the folder against its manifest, failing closed: every file present must be listed
    (with ``class.pkl`` and the state files among them) and match its sha256; raise
    ``ChecksumError`` otherwise. Nothing is unpickled before this passes."""
    directory = Path(directory)
    manifest = manifest or read_manifest(directory)
    listed = manifest["files"]
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file() or p.is_symlink()}
    unlisted = sorted(present - set(listed) - {MANIFEST} - SIDECAR_FILES)
    if unlisted:
        raise ChecksumError(
            f"Checkpoint `{directory}` holds files its manifest does not list: {unlisted}. "
            "They were added after it was written; nothing was loaded."
        )
    for rel, expected in listed.items():
        path = directory / rel
        if path.is_symlink() or not path.is_file():
            raise ChecksumError(
                f"Checkpoint `{directory}` is missing `{rel}`, listed in its manifest "
                "(or it is a link); nothing was loaded."
            )
        actual = sha256(path)
        if actual != expected:
            raise ChecksumError(
                f"Checksum mismatch for `{rel}` in checkpoint `{directory}`: the manifest says "
                f"sha256 {expected[:12]}..., the file has {actual[:12]}.... The file was changed "
                "or corrupted after it was written; nothing was loaded."
            )
    return manifest


def read_state(model: Any, directory: str | Path) -> dict[str, Any]:
    """The state a checkpoint holds: the backend's entries and any added by a hook (call after ``verify``)."""
    state_dir = Path(directory) / STATE_DIR
    state = model.backend.read_state(model, state_dir)
    if (state_dir / EXTRA_FILE).is_file():
        state.update(serialization.loads((state_dir / EXTRA_FILE).read_bytes()))
    return state


def read_run_state(directory: str | Path) -> dict[str, Any] | None:
    """A training run's own state (callbacks, RNG), if the checkpoint was written by one."""
    path = Path(directory) / STATE_DIR / RUN_FILE
    return serialization.loads(path.read_bytes()) if path.is_file() else None


def version_differences(manifest: dict[str, Any]) -> list[str]:
    """``"torch 2.1 (now 2.3)"`` for each library the checkpoint recorded that is installed in another version."""
    saved = manifest.get("versions", {})
    current = library_versions(tuple(name for name in saved if name != "python"))
    return [
        f"{name} {saved[name]} (now {current[name]})"
        for name in sorted(saved)
        if name in current and saved[name] != current[name]
    ]


def load_model(path: str | os.PathLike[str], config: Mapping[str, Any] | None = None, base: type | None = None) -> Any:
    """A model instance (class, config, weights) from a checkpoint, in any process.

    What ``RayModel.from_checkpoint`` does; the drivers call it here, so none of
    them imports ``raymodel.model``. Every check runs before anything is unpickled.
    """
    import warnings

    if config is not None and not isinstance(config, Mapping):
        raise SettingsError(
            f"`config` must be a dict of entries merged over the checkpoint's config (got {config!r} "
            f"that is a {type(config).__name__})."
        )
    with local_copy(path) as directory:
        manifest = verify(directory)
        diffs = version_differences(manifest)
        if diffs:
            warnings.warn(
                "This checkpoint was written with other library versions: "
                + ", ".join(diffs)
                + ". Loading usually works, but pickled code may behave differently.",
                RuntimeWarning,
                stacklevel=3,
            )
        klass, saved_config = load_class(directory, manifest)
        if base is not None and not (isinstance(klass, type) and issubclass(klass, base)):
            raise CheckpointError(
                f"The checkpoint at `{path}` holds a `{getattr(klass, '__name__', klass)}`, which is "
                f"not a `{base.__name__}`. Load it with `raymodel.RayModel.from_checkpoint`."
            )
        model = klass(config={**saved_config, **dict(config or {})})
        model.load_weights(directory, _verified=manifest)
    model.source = {"checkpoint": os.fspath(path)}
    return model


def load_class(directory: str | Path, manifest: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """Unpickle the model class and config (call only after ``verify``)."""
    with open(Path(directory) / CLASS_FILE, "rb") as fh:
        payload = serialization.loads(fh.read())
    return payload["class"], payload["config"]


def state_from_files(model: Any, files: dict[str, bytes]) -> dict[str, Any]:
    """The backend state held in ``files`` (``{relative path: bytes}`` of a state folder)."""
    with tmp.tempdir("state") as staging:
        for rel, data in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return model.backend.read_state(model, staging)


@contextlib.contextmanager
def local_copy(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a local directory for ``path``, downloading it first when it is a URI."""
    from raymodel._internal import storage

    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise CheckpointError(
            f"`path` must be a checkpoint folder or URI (a non-empty str or path), got {path!r} that is a "
            f"{type(path).__name__}. Pass e.g. `result.checkpoint.path` or the folder `model.save()` wrote."
        )
    try:
        with storage.local_folder(os.fspath(path), "ckpt") as directory:
            yield directory
    except (OSError, ValueError) as exc:  # pyarrow: unreachable store, bad URI, no such bucket
        if isinstance(exc, FileNotFoundError) or "://" not in os.fspath(path):
            raise
        raise CheckpointError(f"Cannot read the checkpoint at `{path}`: {exc}") from exc


def set_state(model: Any, state: dict[str, Any], manifest: dict[str, Any], path: Any) -> None:
    """Load ``state`` into ``model``; a checkpoint that does not fit (its config made other shapes) is a
    ``CheckpointError`` naming the first parameter that differs, with both shapes."""
    where = f"The checkpoint at `{os.fspath(path)}` does not fit `{type(model).__name__}`"
    differs = config_differences(manifest.get("config") or {}, model.config)
    because = f" (its config differs from the checkpoint's: {differs})" if differs else ""
    mismatch = state_mismatch(model.backend.get_state(model), state)
    if mismatch:
        mismatch = mismatch.replace("`modules.", "`").replace("`weights[", "`weight array [")
        raise CheckpointError(f"{where}: {mismatch}{because}. Load it with the config it was saved with.")
    try:
        model.backend.set_state(model, state)
    except RayModelError:
        raise
    except Exception as exc:  # the framework's own error for anything else that does not fit
        raise CheckpointError(f"{where}{because}: {type(exc).__name__}: {exc}") from exc


def state_mismatch(current: Any, loaded: Any, where: str = "") -> str | None:
    """The first parameter whose shape differs between a model's state and a checkpoint's, or that one
    of them lacks: ``"`net.0.weight` has shape (8, 4) in the checkpoint and (16, 4) in the model"``;
    ``None`` when they fit (entries only one side has, such as optimizer state, are not compared)."""
    if isinstance(current, dict) and isinstance(loaded, dict):
        leaves = lambda d: d and all(hasattr(v, "shape") for v in d.values())  # noqa: E731 - a state_dict
        if leaves(current) and leaves(loaded):
            only_model, only_checkpoint = current.keys() - loaded.keys(), loaded.keys() - current.keys()
            for side, other, names in (("model", "checkpoint", only_model), ("checkpoint", "model", only_checkpoint)):
                if names:
                    return f"`{_join(where, sorted(map(str, names))[0])}` is in the {side} but not in the {other}"
        for key in loaded:
            if key in current:
                found = state_mismatch(current[key], loaded[key], _join(where, str(key)))
                if found:
                    return found
        return None
    if isinstance(current, (list, tuple)) and isinstance(loaded, (list, tuple)):
        arrays = current and loaded and all(hasattr(v, "shape") for v in (*current, *loaded))
        if arrays and len(current) != len(loaded):
            counts = f"{len(loaded)} arrays in the checkpoint and {len(current)} in the model"
            return f"`{where or 'weights'}` holds {counts}"
        for i, (a, b) in enumerate(zip(current, loaded)):
            found = state_mismatch(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    a, b = getattr(current, "shape", None), getattr(loaded, "shape", None)
    if a is not None and b is not None and tuple(a) != tuple(b):
        return f"`{where}` has shape {tuple(b)} in the checkpoint and {tuple(a)} in the model"
    return None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """``hidden=16 (checkpoint: 8)`` for each config entry the model has that differs from the checkpoint's."""
    now = plain_json(current)
    return ", ".join(
        f"{k}={now[k]!r} (checkpoint: {saved[k]!r})" for k in sorted(now) if k in saved and saved[k] != now[k]
    )
