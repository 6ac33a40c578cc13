"""Training on Ray Train V2: ``model.train(settings, data=...)``.

``Trainable`` (the driver) builds the backend's Ray trainer; ``WorkerRun`` (the
worker) runs one run's lifecycle for every backend. Nothing here imports
``raymodel.tune``; each Tune trial fits a ``Trainable``.
"""

from raymodel.train._driver import Trainable, initial_state, prepare
from raymodel.train._progress import ProgressPrinter, format_metrics
from raymodel.train._result import TrainResult
from raymodel.train._run import WorkerRun
from raymodel.train._settings import TrainSettings, worker_resources

__all__ = [
    "Trainable",
    "TrainSettings",
    "TrainResult",
    "WorkerRun",
    "prepare",
    "initial_state",
    "worker_resources",
    "ProgressPrinter",
    "format_metrics",
]
