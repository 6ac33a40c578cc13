"""Locations that may be local paths or ``pyarrow.fs`` URIs (``s3://``, ``gs://``, ``file://``).

A location is a plain string. A URI keeps its scheme and its query
(``s3://bucket/runs?endpoint_override=host:9000&scheme=http``) through every
join, so a result, a checkpoint or a registry entry names a place any node can
read, not a path on the machine that wrote it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Iterator


def is_uri(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def split_query(location: str) -> tuple[str, str]:
    """``("s3://b/p", "?x=1")`` for ``"s3://b/p?x=1"``; a local path has no query."""
    if not is_uri(location) or "?" not in location:
        return location, ""
    base, query = location.split("?", 1)
    return base, "?" + query


def join(location: str, *names: str) -> str:
    """``location/names...``, keeping a URI's query at the end."""
    base, query = split_query(location)
    return "/".join([base.rstrip("/"), *(n.strip("/") for n in names if n)]) + query


def local_path(location: str) -> Path:
    return Path(location.removeprefix("file://")).expanduser()


def filesystem(location: str, streamed: bool = False) -> tuple[Any, str]:
    """``(pyarrow filesystem, path on it)`` for a path or URI. ``streamed``: for one large file written
    from memory, an S3 filesystem that sends each part before it takes the next (pyarrow's default,
    background writes, queues the parts: a copy of the whole file, in memory, while it uploads)."""
    import pyarrow.fs

    if is_uri(location):
        fs, path = pyarrow.fs.FileSystem.from_uri(location)
        if streamed and isinstance(fs, pyarrow.fs.S3FileSystem):
            rebuild, (options,) = fs.__reduce__()
            fs = rebuild({**options, "background_writes": False})
        return fs, path.rstrip("/")
    return pyarrow.fs.LocalFileSystem(), str(local_path(location).resolve())


def rebase(root: str, fs_path: str) -> str:
    """The location of ``fs_path`` (a path on ``root``'s filesystem, as Ray hands them back: no
    scheme) written the way ``root`` is, so it keeps ``root``'s scheme and query."""
    if not is_uri(root):
        return fs_path
    _, base = filesystem(root)
    rel = fs_path.rstrip("/")
    if rel != base and not rel.startswith(base + "/"):
        raise ValueError(f"`{fs_path}` is not under `{root}`.")
    return join(root, rel[len(base) :])


def exists(location: str) -> bool:
    if not is_uri(location):
        return local_path(location).exists()
    import pyarrow.fs

    fs, remote = filesystem(location)
    return fs.get_file_info(remote).type != pyarrow.fs.FileType.NotFound


def listdir(location: str) -> list[str]:
    """Names directly under ``location`` (empty when it does not exist)."""
    if not is_uri(location):
        path = local_path(location)
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    import pyarrow.fs

    fs, remote = filesystem(location)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(remote, allow_not_found=True))
    return sorted(info.base_name for info in infos)


def files_under(location: str) -> list[str]:
    """Every file below ``location``, as paths relative to it (empty when it does not exist)."""
    if not is_uri(location):
        root = local_path(location)
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    import pyarrow.fs

    fs, remote = filesystem(location)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(remote, recursive=True, allow_not_found=True))
    return sorted(i.path[len(remote) + 1 :] for i in infos if i.type == pyarrow.fs.FileType.File)


def read_bytes(location: str) -> bytes:
    """The file at ``location``, whole: on an object store, one read of its known size (an input stream
    read to its end goes in small requests, each a round trip: a hundred times slower on S3)."""
    if not is_uri(location):
        return local_path(location).read_bytes()
    fs, remote = filesystem(location)
    with fs.open_input_file(remote) as fh:
        return fh.read()


def write_text(location: str, text: str) -> None:
    """Replace the small file at ``location`` whole (``write_bytes``)."""
    write_bytes(location, text.encode())


def write_bytes(location: str, data: bytes) -> None:
    """Replace the file at ``location`` whole: locally a temporary file beside it, flushed to disk and
    renamed over it (a kill at any point leaves the old file or the new one); on an object store one PUT."""
    if not is_uri(location):
        path = local_path(location)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(3).hex()}")
        try:
            with open(staged, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(staged, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                staged.unlink()
        return
    fs, remote = filesystem(location)
    with fs.open_output_stream(remote) as fh:
        fh.write(data)


def upload(source: str | Path, location: str, last: str | None = None) -> str:
    """Copy the folder ``source`` to ``location`` (a URI), the file ``last`` after every other one.

    Object stores have no folder rename: a reader that waits for ``last`` (a
    checkpoint's manifest, a registry record) never sees a half-copied folder.
    """
    fs, path = filesystem(location)
    source = Path(source)
    files = sorted(
        (p for p in source.rglob("*") if p.is_file()), key=lambda p: p.relative_to(source).as_posix() == last
    )
    for file in files:
        with fs.open_output_stream(f"{path}/{file.relative_to(source).as_posix()}") as fh, open(file, "rb") as src:
            shutil.copyfileobj(src, fh, 1 << 20)
    return location


def download(location: str, into: str | Path) -> Path:
    """Copy the folder at ``location`` into the local folder ``into``."""
    import pyarrow.fs

    fs, path = filesystem(location)
    Path(into).mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(path, str(into), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return Path(into)


def delete(location: str) -> None:
    """Remove the folder (or file) at ``location``; nothing happens when it is absent."""
    if not is_uri(location):
        path = local_path(location)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return
    import pyarrow.fs

    fs, remote = filesystem(location)
    info = fs.get_file_info(remote)
    with contextlib.suppress(FileNotFoundError, OSError):
        if info.type == pyarrow.fs.FileType.Directory:
            fs.delete_dir(remote)
        elif info.type == pyarrow.fs.FileType.File:
            fs.delete_file(remote)


@contextlib.contextmanager
def local_folder(location: str, prefix: str = "fetch") -> Iterator[Path]:
    """A local folder with the files at ``location`` (the folder itself when it is local)."""
    if not is_uri(location):
        yield local_path(location)
        return
    from raymodel._internal import tmp

    with tmp.tempdir(prefix) as directory:
        yield download(location, directory)


def ensure_dir(location: str) -> None:
    if is_uri(location):
        fs, remote = filesystem(location)
        fs.create_dir(remote, recursive=True)
    else:
        os.makedirs(local_path(location), exist_ok=True)
