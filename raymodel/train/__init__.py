"""Training on Ray Train V2: ``model.train(settings, data=...)``.

``Trainable`` (the driver) plans a run and fits the backend's run type (a Ray Train
run, ``_ray_train_run.py``, or the backend's own); ``WorkerRun`` (the worker) runs one
run's lifecycle for every backend. Nothing here imports
``raymodel.tune``; each Tune trial fits a ``Trainable``.
"""

from __future__ import annotations

from typing import Any

from raymodel.train._driver import Trainable, initial_state, prepare, with_parent
from raymodel.train._hub import Collective, gathers_through_hub, start_hub, stop_hub
from raymodel.train._methods import DPO, GRPO
from raymodel.train._plots import train_figure, tune_figure
from raymodel.train._progress import HubRows, ProgressPrinter, format_metrics, is_terminal
from raymodel.train._result import TrainResult
from raymodel.train._session import LocalSession
from raymodel.train._settings import TrainSettings, worker_resources
from raymodel.train._worker_run import WorkerRun

__all__ = [
    "train_figure",
    "tune_figure",
    "DPO",
    "GRPO",
    "Trainable",
    "TrainSettings",
    "TrainResult",
    "WorkerRun",
    "LocalSession",
    "prepare",
    "initial_state",
    "worker_resources",
    "with_parent",
    "ProgressPrinter",
    "format_metrics",
    "is_terminal",
    "HubRows",
    "Collective",
    "gathers_through_hub",
    "start_hub",
    "stop_hub",
    "ray_train_run",
]


def ray_train_run(backend: Any, plan: Any) -> Any:
    """The Ray Train run of ``plan`` (a ``raymodel.contract.TrainingRun``) with ``backend``'s trainer.
    Imports ``ray.train`` on first use (about a second), which only a run needs."""
    from raymodel.train._ray_train_run import RayTrainRun

    return RayTrainRun(backend, plan)
