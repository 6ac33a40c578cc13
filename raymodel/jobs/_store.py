"""What the training server keeps in its storage, so that a restart loses no job.

Under ``$RAYMODEL_HOME/jobs`` (a local path or any storage URI, S3 included):

* ``<id>.json``: the job's record, replaced whole at every change (``storage.write_bytes``:
  a kill at any point leaves the old record or the new one, never half of one);
* ``<id>/payload.pkl``: what the job runs (the class by value, config, settings, its data or
  where its data is) and its pool's spec, written before ``submit`` answers;
* ``<id>/data/*.npy``: a job's large arrays, written once by the submitting process
  (``write_array``: straight from the array's memory, no copy) and read by the job's runner
  as a memory map, which it puts in Ray's object store for the workers.

A finished job keeps its record; its folder is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import time
from typing import Any, Iterator

import numpy as np

from raymodel._internal import locations, storage

#: Arrays smaller than this ride in the job's payload; larger ones are written as ``.npy`` files.
FILE_BYTES = 1 << 20


def root() -> str:
    return locations.home_path("jobs")


def new_id(kind: str) -> str:
    """A job's id, made by the submitting process (a retried ``submit`` finds the job it made)."""
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"


def folder(job_id: str) -> str:
    return storage.join(root(), job_id)


# ---------------------------------------------------------------- records
def save_record(record: dict[str, Any]) -> None:
    storage.write_text(storage.join(root(), f"{record['id']}.json"), json.dumps(record, default=repr))


def load_records() -> Iterator[dict[str, Any]]:
    """Every record in storage (one that cannot be read is skipped: records are written whole)."""
    base = root()
    for name in storage.listdir(base):
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            yield json.loads(storage.read_bytes(storage.join(base, name)))
        except (OSError, ValueError):
            continue


# ---------------------------------------------------------------- payloads
def save_payload(job_id: str, payload: bytes, pool: dict[str, Any] | None) -> None:
    storage.write_bytes(storage.join(folder(job_id), "payload.pkl"), pickle.dumps({"payload": payload, "pool": pool}))


def load_payload(job_id: str) -> tuple[bytes, dict[str, Any] | None] | None:
    """``(payload, pool spec)`` of a job, or ``None`` when its storage has none."""
    try:
        kept = pickle.loads(storage.read_bytes(storage.join(folder(job_id), "payload.pkl")))
    except (OSError, ValueError, pickle.UnpicklingError, EOFError):
        return None
    return kept["payload"], kept["pool"]


def folders() -> set[str]:
    """The ids of the jobs that have a folder (a payload, data) in storage: one listing."""
    try:
        return {n for n in storage.listdir(root()) if not n.endswith(".json") and not n.startswith(".")}
    except OSError:
        return set()


def remove(job_id: str) -> None:
    """A finished job's payload and data (its record stays)."""
    with contextlib.suppress(OSError):
        storage.delete(folder(job_id))


# ---------------------------------------------------------------- arrays
@dataclasses.dataclass(frozen=True)
class StoredArray:
    """An array of a job's data written to ``location`` (a ``.npy`` file in the job's folder)."""

    location: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


def write_array(location: str, array: np.ndarray) -> StoredArray:
    """``array`` as a ``.npy`` file at ``location``, written from its own memory (no copy is made of a
    contiguous array), whole or not at all."""
    if storage.is_uri(location):
        fs, remote = storage.filesystem(location, streamed=True)
        with fs.open_output_stream(remote) as fh:
            np.lib.format.write_array(fh, array, allow_pickle=False)
    else:
        path = storage.local_path(location)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        with open(staged, "wb") as fh:
            np.lib.format.write_array(fh, array, allow_pickle=False)
        os.replace(staged, path)
    return StoredArray(location, tuple(int(n) for n in array.shape), array.dtype.str)


def load_array(stored: StoredArray) -> np.ndarray:
    """The array as a read-only memory map of its file (a URI's file is read whole)."""
    if storage.is_uri(stored.location):
        import io

        return np.load(io.BytesIO(storage.read_bytes(stored.location)))
    return np.asarray(np.load(storage.local_path(stored.location), mmap_mode="r"))


def put_array(stored: StoredArray) -> Any:
    """The array in Ray's object store, read from its file as a memory map (one copy: the store's; a
    plain ``ndarray`` view, which Ray writes straight from the map, where a ``memmap`` is pickled whole)."""
    import ray

    if not storage.is_uri(stored.location):
        return ray.put(np.asarray(np.load(storage.local_path(stored.location), mmap_mode="r")))
    from raymodel._internal import tmp

    with tmp.tempdir("job-data") as local:
        target = local / "array.npy"
        fs, path = storage.filesystem(stored.location)
        with fs.open_input_stream(path) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 24):
                dst.write(chunk)
        return ray.put(np.asarray(np.load(target, mmap_mode="r")))
