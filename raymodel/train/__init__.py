"""Training on Ray Train V2: ``model.train(settings, data=...)``.

Nothing here imports ``raymodel.tune``; Tune calls :func:`run_training`.
"""

from raymodel.train._driver import prepare, run_training
from raymodel.train._progress import ProgressCallback, ProgressPrinter, format_metrics
from raymodel.train._result import TrainResult
from raymodel.train._settings import TrainSettings

__all__ = ["TrainSettings", "TrainResult", "run_training", "prepare", "ProgressCallback", "ProgressPrinter",
           "format_metrics"]
