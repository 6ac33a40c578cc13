"""Temporary folders that never outlive their writer for long.

Every temporary folder raymodel makes is named ``<kind>-<host>-<pid>-<random>``:
it is removed when its block ends (error or not), and if the process was
killed before that, the next writer collects it, once its owner is gone
(same host, process no longer running) or it is older than a day (another
host's, or a reused pid). A live writer's folder is never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Iterator

#: Folders of another host (whose process we cannot check) are collected after this long.
MAX_AGE_S = 24 * 3600


def root() -> Path:
    """``$TMPDIR/raymodel-<uid>``: the parent of raymodel's temporary folders on this node."""
    import tempfile

    path = Path(tempfile.gettempdir()) / f"raymodel-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def owned_name(kind: str) -> str:
    host = socket.gethostname().replace("-", "_")[:32]
    return f"{kind}-{host}-{os.getpid()}-{os.urandom(4).hex()}"


@contextlib.contextmanager
def tempdir(kind: str, parent: Path | None = None) -> Iterator[Path]:
    """A fresh folder under ``parent`` (default ``root``), removed when the block ends."""
    parent = root() if parent is None else parent
    collect(parent, kind)
    path = parent / owned_name(kind)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def replacing(target: Path, kind: str) -> Iterator[Path]:
    """A fresh folder beside ``target`` to write into; when the block ends without error it is
    renamed to ``target`` (an empty folder there is replaced), so ``target`` appears whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = make(kind, parent=target.parent)  # beside the target: the rename is atomic
    try:
        yield staging
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone after the rename; left-overs of a failure


def make(kind: str, parent: Path | None = None) -> Path:
    """A fresh folder the caller removes (e.g. after handing it to Ray Train's upload)."""
    parent = root() if parent is None else parent
    collect(parent, kind)
    path = parent / owned_name(kind)
    path.mkdir(parents=True)
    return path


def collect(parent: Path, kind: str) -> int:
    """Remove ``kind`` folders under ``parent`` whose writer is gone; returns how many."""
    removed = 0
    try:
        entries = list(parent.iterdir())
    except OSError:
        return 0
    for entry in entries:
        if entry.name.startswith(f"{kind}-") and _abandoned(entry, kind):
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def _abandoned(entry: Path, kind: str) -> bool:
    parts = entry.name[len(kind) + 1 :].split("-")
    if len(parts) != 3 or not parts[1].isdigit():
        return False  # not one of ours
    try:
        age = time.time() - entry.stat().st_mtime
    except OSError:
        return False
    if parts[0] == socket.gethostname().replace("-", "_")[:32]:
        return not _alive(int(parts[1])) or age > MAX_AGE_S
    return age > MAX_AGE_S


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
