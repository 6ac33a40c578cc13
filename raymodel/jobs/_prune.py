"""What the training server leaves on disk, kept bounded: pools' run folders, the whole-model
cache, and finished jobs' folders.

* ``$RAYMODEL_HOME/pools/<pool>``: Ray Train's own files of each pool's run (no job writes
  there). A pool that has ended has no use for them.
* ``$TMPDIR/raymodel-<uid>/whole``: whole weights consolidated from sharded (FSDP) checkpoints,
  one file per checkpoint, for replicas and ``predict`` on this node.
* ``$RAYMODEL_HOME/jobs/<id>``: a job's payload and data; removed when the job ends, and here
  when a server was killed before it could.

An entry goes when it has not changed for ``prune_after_s`` (``RAYMODEL_PRUNE_AFTER_S``, default
a day), and the oldest go first while a kind holds more than ``prune_max_mb``
(``RAYMODEL_PRUNE_MAX_MB``, default 2048). What is in use (a live pool's folder, a job not done)
is never touched.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterable

from raymodel._internal import locations, storage, tmp

DEFAULTS = {"prune_after_s": 24 * 3600.0, "prune_max_mb": 2048.0}
_ENV = {"prune_after_s": "RAYMODEL_PRUNE_AFTER_S", "prune_max_mb": "RAYMODEL_PRUNE_MAX_MB"}


def limits_from_env() -> dict[str, float]:
    """The pruning limits, from the environment (defaults where unset); a bad value is an error."""
    from raymodel.exceptions import SettingsError

    limits = dict(DEFAULTS)
    for key, name in _ENV.items():
        raw = os.environ.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if value < 0:
            raise SettingsError(f"`{name}` must be a number >= 0 (got {raw!r}).")
        limits[key] = value
    return limits


def entries(location: str) -> list[tuple[str, float, int]]:
    """``(location, last change, bytes)`` of each folder or file directly under ``location``."""
    import pyarrow.fs

    fs, base = storage.filesystem(location)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(base, allow_not_found=True, recursive=True))
    except OSError:
        return []
    found: dict[str, list[float]] = {}
    for info in infos:
        top = info.path[len(base) :].lstrip("/").split("/", 1)[0]
        if not top or top.startswith("."):
            continue
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        entry = found.setdefault(top, [0.0, 0])
        entry[0] = max(entry[0], mtime)
        if info.type == pyarrow.fs.FileType.File:
            entry[1] += info.size or 0
    return [(storage.join(location, name), when, int(size)) for name, (when, size) in found.items()]


def choose(found: Iterable[tuple[str, float, int]], limits: dict[str, float], now: float) -> list[str]:
    """Which entries go: those unchanged for ``prune_after_s``, then the oldest while the rest hold
    more than ``prune_max_mb``."""
    kept = sorted(found, key=lambda e: e[1])
    gone = [e for e in kept if now - e[1] >= limits["prune_after_s"]]
    kept = [e for e in kept if e not in gone]
    budget = limits["prune_max_mb"] * (1 << 20)
    while kept and sum(e[2] for e in kept) > budget:
        gone.append(kept.pop(0))
    return [e[0] for e in gone]


def prune(live_pools: set[str], done_jobs: set[str], limits: dict[str, float]) -> dict[str, int]:
    """Remove what ``choose`` picks among ended pools' folders, whole-model cache files and folders of
    jobs that are done (a folder whose record the server has not seen yet is being submitted); returns
    how many of each went."""
    now = time.time()
    pools = [e for e in entries(locations.home_path("pools")) if _name(e[0]) not in live_pools]
    jobs = [e for e in entries(locations.home_path("jobs")) if not e[0].endswith(".json")]
    jobs = [e for e in jobs if _name(e[0]) in done_jobs]
    whole = [e for e in entries(str(tmp.root() / "whole")) if not _name(e[0]).startswith(".")]
    counts = {}
    for kind, found, rule in (
        ("pools", pools, limits),
        ("whole", whole, limits),
        ("jobs", jobs, {**limits, "prune_after_s": 0.0}),  # a done job's folder has no use
    ):
        gone = choose(found, rule, now)
        for location in gone:
            storage.delete(location)
        counts[kind] = len(gone)
    return counts


def _name(location: str) -> str:
    return Path(storage.split_query(location)[0]).name
