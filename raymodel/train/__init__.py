"""Training on Ray Train V2: ``model.train(settings, data=...)``.

Nothing here imports ``raymodel.tune``; each Tune trial fits a :class:`Trainable`.
"""

from raymodel.train._driver import Trainable, prepare
from raymodel.train._progress import ProgressPrinter, format_metrics
from raymodel.train._result import TrainResult
from raymodel.train._settings import TrainSettings

__all__ = ["Trainable", "TrainSettings", "TrainResult", "prepare", "ProgressPrinter",
           "format_metrics"]
