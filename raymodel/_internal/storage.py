"""Locations that may be local paths or ``pyarrow.fs`` URIs (``s3://``, ``gs://``, ``file://``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def is_uri(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def join(location: str, *names: str) -> str:
    return "/".join([location.rstrip("/"), *names])


def filesystem(location: str) -> tuple[Any, str]:
    """``(pyarrow filesystem, path on it)`` for a path or URI."""
    import pyarrow.fs

    if is_uri(location):
        return pyarrow.fs.FileSystem.from_uri(location)
    return pyarrow.fs.LocalFileSystem(), str(Path(location.removeprefix("file://")).expanduser().resolve())


def listdir(location: str) -> list[str]:
    """Names directly under ``location`` (empty when it does not exist)."""
    if not is_uri(location):
        path = Path(location.removeprefix("file://")).expanduser()
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    import pyarrow.fs

    fs, path = filesystem(location)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    return sorted(info.base_name for info in infos)
