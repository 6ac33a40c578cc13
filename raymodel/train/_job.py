"""A training run as a job of the training server: what ``server.submit`` takes.

``raymodel.jobs`` (``model.train``, ``wait=False``) and a Tune trial with
several workers (which sits below ``raymodel.jobs``) both submit this way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raymodel._internal import serialization
from raymodel.train._driver import initial_state
from raymodel.train._settings import TrainSettings, worker_resources


def pool_key(backend: str, num_workers: int, resources: dict[str, float]) -> str:
    """What a job's workers need, as one string: jobs with the same key share a pool."""
    shown = ",".join(f"{k}={v:g}" for k, v in sorted(resources.items()))
    return f"{backend}/{num_workers}x[{shown}]"


def train_request(
    model: Any,
    settings: TrainSettings,
    spec: Any,
    *,
    hub: Any = None,
    deliver: bool = False,
    info: dict[str, Any] | None = None,
    resume_from: str | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """``(payload, info)`` for ``server.submit("train", ...)`` of a checked model, settings and data.

    ``hub``: a blocking caller's, for its progress output (or a Tune trial's rows, which with
    ``deliver`` wait for the trial's answer); ``info`` and ``resume_from`` as for ``Trainable``.
    ``ray.data`` Datasets go in ``info["datasets"]``, a Ray argument, not in the payload.
    """
    datasets = spec.ray_datasets
    if datasets:  # Ray objects travel in-band (Ray tracks their owner), not inside the pickled payload
        from raymodel.data._splits import RayDataset

        splits = {n: RayDataset(s.key) if isinstance(s, RayDataset) else s for n, s in spec.splits.items()}
        spec = dataclasses.replace(spec, splits=splits)
    per_worker = worker_resources(settings.resources_per_worker, settings.use_gpu)
    needs = {k: v * max(settings.num_workers, 1) for k, v in per_worker.items()}
    payload = {
        "class": type(model),
        "config": dict(model.config),
        "settings": settings,
        "data": spec,
        "state": initial_state(model),
        "deliver": deliver,
        "info": info,
        "resume_from": resume_from,
    }
    request: dict[str, Any] = {
        "needs": needs,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "settings": repr(settings),
        "epochs": settings.num_epochs,
        "hub": hub,
        "datasets": datasets or None,
    }
    if settings.pool and settings.num_workers > 0:
        backend = model.backend
        request["pool"] = {
            "key": pool_key(backend.name, settings.num_workers, per_worker),
            "backend": serialization.dumps(backend, type(backend)),
            "backend_name": backend.name,
            "num_workers": settings.num_workers,
            "per_worker": per_worker,
            "use_gpu": settings.use_gpu,
        }
    return serialization.dumps(payload, type(model), *settings.callbacks), request
