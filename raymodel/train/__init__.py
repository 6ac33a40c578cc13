"""Training on Ray Train V2: ``model.train(settings, data=...)``.

``Trainable`` (the driver) builds the backend's Ray trainer; ``WorkerRun`` (the
worker) runs one run's lifecycle for every backend. Nothing here imports
``raymodel.tune``; each Tune trial fits a ``Trainable``.
"""

from __future__ import annotations

from typing import Any

from raymodel.train._driver import Trainable, initial_state, prepare
from raymodel.train._progress import ProgressPrinter, format_metrics, is_terminal
from raymodel.train._result import TrainResult
from raymodel.train._session import LocalSession
from raymodel.train._settings import TrainSettings, worker_resources
from raymodel.train._worker_run import WorkerRun

__all__ = [
    "Trainable",
    "TrainSettings",
    "TrainResult",
    "WorkerRun",
    "LocalSession",
    "prepare",
    "initial_state",
    "worker_resources",
    "ProgressPrinter",
    "format_metrics",
    "is_terminal",
    "progress_callback",
]


def progress_callback(hub: Any, wait: bool = False, root: str | None = None) -> Any:
    """A Ray Train ``UserCallback`` that sends each report's rank-0 row to ``hub`` (with ``wait``, the
    report waits for the reader's acknowledgement; ``root`` gives checkpoint paths their scheme back).
    Imports ``ray.train`` on first use (about a second), which only a run needs."""
    from raymodel.train._controller_rows import ProgressCallback

    return ProgressCallback(hub, wait=wait, root=root)
