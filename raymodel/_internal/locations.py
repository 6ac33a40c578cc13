"""Where raymodel keeps its files (``RAYMODEL_HOME``), and the names of the runs it writes there."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path


def home() -> str:
    """``RAYMODEL_HOME`` (default ``~/.raymodel``): run outputs and the registry.

    A local path is made absolute; a URI (``s3://...``) is returned as is.
    """
    value = os.environ.get("RAYMODEL_HOME") or "~/.raymodel"
    if "://" in value:
        return value.rstrip("/")
    return str(Path(value).expanduser().resolve())


def home_path(*names: str) -> str:
    """A location under ``RAYMODEL_HOME`` (a URI keeps its scheme and query)."""
    from raymodel._internal import storage

    return storage.join(home(), *names)


def runs_root() -> str:
    root = home()
    if "://" in root:
        return home_path("runs")
    path = Path(root) / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def run_name(prefix: str) -> str:
    """A unique, readable run name: ``DigitsNet-2026-11-21_12-05-10-4f3a``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", prefix)
    return f"{safe}-{time.strftime('%Y-%m-%d_%H-%M-%S')}-{os.urandom(2).hex()}"
