"""A training run as a job of the training server: what ``server.submit`` takes.

``raymodel.jobs`` (``model.train``, ``wait=False``) and a Tune trial with
several workers (through the ``TrainingServer`` port) both submit this way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from raymodel._internal import locations, serialization, storage
from raymodel.data import Arrays, InStore, RayDataset, in_object_store
from raymodel.jobs import _store
from raymodel.train import TrainSettings, initial_state, with_parent, worker_resources


def pool_key(kind: str, num_workers: int, resources: dict[str, float]) -> str:
    """What a job's workers need, as one string: jobs with the same key share a pool."""
    shown = ",".join(f"{k}={v:g}" for k, v in sorted(resources.items()))
    return f"{kind}/{num_workers}x[{shown}]"


def pool_kind(backend: Any) -> str:
    """The pools ``backend``'s jobs run on: its pool's ``family`` (``"torch"`` for torch, Lightning and
    transformers, whose runs are the same worker group, process group and collective), or its own name."""
    return backend.pool.family or backend.name


def pool_spec(backend: Any, settings: TrainSettings, per_worker: dict[str, float]) -> dict[str, Any]:
    """What the server starts a pool for a job of ``backend`` and ``settings`` from (its key first)."""
    kind = pool_kind(backend)
    return {
        "key": pool_key(kind, settings.max_workers, per_worker),
        "backend": serialization.dumps(backend, type(backend)),
        "kind": kind,
        "names": (backend.name,),  # the backends it was started for (warm: each named); `imports`: what they import
        "imports": tuple(backend.pool.worker_imports),
        "num_workers": settings.num_workers,
        "per_worker": per_worker,
        "use_gpu": settings.use_gpu,
    }


def train_request(
    model: Any,
    settings: TrainSettings,
    spec: Any,
    *,
    hub: Any = None,
    deliver: bool = False,
    info: dict[str, Any] | None = None,
    resume_from: str | None = None,
    kind: str = "train",
    more: dict[str, Any] | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """``(payload, info)`` for ``server.submit("train", ...)`` of a checked model, settings and data.

    ``hub``: a blocking caller's, for its progress output (or a Tune trial's rows, which with
    ``deliver`` wait for the trial's answer); ``info`` and ``resume_from`` as for ``Trainable``.
    Ray objects (``ray.data`` Datasets, arrays already in the object store) go in ``info["datasets"]``
    and ``info["refs"]``, Ray arguments (Ray tracks their owner), not in the pickled payload; they
    make the job non-durable (``info["not_durable"]`` says why). Large arrays are written once to
    the job's storage (``.npy``) and the payload holds where (``_store.StoredArray``). ``kind`` and
    ``more`` (payload entries): a job that trains first (``"release"``).
    """
    from raymodel._ray import remote

    remote.refuse_local("TrainSettings.storage_path", settings.storage_path)  # before any array is written
    job_id = _store.new_id(kind)
    datasets = spec.ray_datasets
    not_durable = None if (info or {}).get("trial_id") else why_not_durable(spec)
    spec, refs = _refs_apart(spec)
    spec = arrays_to_files(spec, job_id)
    run_name = settings.name or locations.run_name(type(model).__name__)
    if settings.name is None:  # fixed now: a preempted job resumes from its own run's checkpoints
        settings = dataclasses.replace(settings, name=run_name)
    per_worker = worker_resources(settings.resources_per_worker, settings.use_gpu)
    needs = model.backend.training.needs(settings)
    payload = {
        "class": type(model),
        "config": dict(model.config),
        "settings": settings,
        "data": spec,
        "state": initial_state(model),
        "deliver": deliver,
        "info": with_parent(model, info) or None,
        "resume_from": resume_from,
        **(more or {}),
    }
    request: dict[str, Any] = {
        "id": job_id,
        "not_durable": not_durable,
        "run_path": storage.join(settings.storage_path or locations.runs_root(), run_name),
        "needs": needs,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "settings": repr(settings),
        "epochs": settings.num_epochs,
        "hub": hub,
        "datasets": datasets or None,
        "refs": refs,
        "trial_id": (info or {}).get("trial_id"),
        "priority": settings.priority,
        "preemptible": settings.preemptible,
        "resource_wait_s": settings.resource_wait_s,
    }
    backend = model.backend
    # Else the job's runner runs it (RLlib: in an actor of its own; a release: one-off runs, then its scoring).
    if settings.on_pool and backend.pool is not None and kind == "train":
        request["pool"] = pool_spec(backend, settings, per_worker)
    return serialization.dumps(payload, type(model), *settings.callbacks), request


@dataclasses.dataclass(frozen=True)
class _RefSlot:
    """Where an object-store array was in a job's data: ``refs[index]`` of the job's Ray arguments."""

    index: int


def _refs_apart(spec: Any) -> tuple[Any, list[Any]]:
    """``spec`` without its Ray objects (Datasets left as keys, array references as ``_RefSlot``), and
    the array references in order."""
    refs: list[Any] = []

    def slot(value: Any) -> Any:
        if isinstance(value, InStore):  # one of the splits' arrays stored together: the one object, once
            return dataclasses.replace(value, ref=slot(value.ref))
        if type(value).__name__ != "ObjectRef":
            return value
        if value not in refs:
            refs.append(value)
        return _RefSlot(refs.index(value))

    splits = {}
    for name, split in spec.splits.items():
        if isinstance(split, RayDataset):
            split = RayDataset(split.key)
        elif isinstance(split, Arrays):
            split = Arrays(slot(split.x), slot(split.y))
        splits[name] = split
    return dataclasses.replace(spec, splits=splits), refs


def why_not_durable(spec: Any) -> str | None:
    """Why a job of this data cannot outlive its server (``None``: it can): data held in this
    cluster's object store is gone with the cluster."""
    for name, split in spec.splits.items():
        if isinstance(split, RayDataset):
            return (
                f"its {name!r} split is a `ray.data` Dataset, whose blocks live in this cluster's object store. "
                "To make it durable, pass arrays, a DataFrame or a `datasets.Dataset`, or a data module whose "
                "`setup(config)` reads the files (`ray.data.read_parquet(...)` inside it)"
            )
        if isinstance(split, Arrays) and any(in_object_store(a) for a in (split.x, split.y)):
            return (
                f"its {name!r} split's arrays are ObjectRefs, which live in this cluster's object store. "
                "To make it durable, pass the numpy arrays themselves (they are written once to the job's storage)"
            )
    return None


def arrays_to_files(spec: Any, job_id: str) -> Any:
    """``spec`` with each array of ``_store.FILE_BYTES`` or more written to the job's folder."""
    splits = {}
    for name, split in spec.splits.items():
        if isinstance(split, Arrays):
            parts = {}
            for part in ("x", "y"):
                array = getattr(split, part)
                if isinstance(array, np.ndarray) and array.nbytes >= _store.FILE_BYTES:
                    array = _store.write_array(storage.join(_store.folder(job_id), "data", f"{name}-{part}.npy"), array)
                parts[part] = array
            split = Arrays(parts["x"], parts["y"])
        splits[name] = split
    return dataclasses.replace(spec, splits=splits)


def restore_refs(spec: Any, datasets: dict[str, Any] | None, refs: list[Any] | None, into_store: bool = True) -> None:
    """Put a job's data back in place (in the job's runner): its Ray objects, which came as Ray
    arguments, and its arrays written to files, which go to the object store from there (without
    ``into_store``: memory maps of the files, for a tune job, which puts its data in the store itself)."""
    datasets, refs = datasets or {}, refs or []
    for split in spec.splits.values():
        if getattr(split, "key", None) in datasets:
            split.dataset = datasets[split.key]
        elif isinstance(split, Arrays):
            for part in ("x", "y"):
                value = getattr(split, part)
                if isinstance(value, _RefSlot):
                    setattr(split, part, refs[value.index])
                elif isinstance(value, InStore) and isinstance(value.ref, _RefSlot):
                    setattr(split, part, dataclasses.replace(value, ref=refs[value.ref.index]))
                elif isinstance(value, _store.StoredArray):
                    setattr(split, part, _store.put_array(value) if into_store else _store.load_array(value))


def tune_payload(model: Any, tunable: Any, settings: Any, job_id: str, resume: bool) -> dict[str, Any]:
    """What a job that tunes carries to the server: the model's class and config, the settings, the
    data written as files under the job's id, the search space."""
    return {
        "class": type(model),
        "config": dict(model.config),
        "settings": settings,
        "data": arrays_to_files(tunable.spec, job_id),
        "space": tunable.space,
        "resume": resume,
    }
