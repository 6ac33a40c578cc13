"""Ready-made callbacks: early stopping and experiment tracking (MLflow, TensorBoard).

Pass them in ``TrainSettings(callbacks=[...])`` (for tuning, in the trials'
``TuneSettings(train={"callbacks": [...]})``); they run on every training
worker, like any ``raymodel.Callback``.
"""

from __future__ import annotations

import math
from typing import Any

from raymodel.callbacks._tracking import MLflowLogger, TensorBoardLogger
from raymodel.exceptions import ModelDefinitionError, SettingsError
from raymodel.hooks import Callback

__all__ = ["EarlyStopping", "MLflowLogger", "TensorBoardLogger"]


class EarlyStopping(Callback):
    """Stop training once ``metric`` has not improved for ``patience`` epochs.

    It sets ``context.should_stop``: every worker stops at the end of the same
    epoch, that epoch's checkpoint is written and the run ends normally (its
    ``TrainResult`` holds the final checkpoint, and the best one when
    ``TrainSettings.metric`` is set). Inside a tune trial it ends that trial
    only. Its count survives a resume (it is saved with each checkpoint).

    Args:
        metric: The epoch metric to watch, e.g. ``"val_loss"`` or ``"val_acc"``.
        mode: ``"min"`` (lower is better) or ``"max"``.
        patience: Epochs without an improvement before stopping (>= 1).
        min_delta: How much better than the best so far counts as an improvement (>= 0).

    Example:
        >>> model.train({"num_epochs": 100, "callbacks": [rm.callbacks.EarlyStopping("val_loss", patience=3)]},
        ...             data=data)
    """

    def __init__(self, metric: str = "val_loss", mode: str = "min", patience: int = 3, min_delta: float = 0.0) -> None:
        problems = []
        if not isinstance(metric, str) or not metric:
            problems.append(f"`metric` must be a metric name such as 'val_loss' (got {metric!r}).")
        if mode not in ("min", "max"):
            problems.append(f"`mode` must be 'min' or 'max' (got {mode!r}).")
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
            problems.append(f"`patience` must be an int >= 1 (got {patience!r}).")
        if not isinstance(min_delta, (int, float)) or isinstance(min_delta, bool) or not min_delta >= 0:
            problems.append(f"`min_delta` must be a number >= 0 (got {min_delta!r}).")
        if problems:
            raise SettingsError("EarlyStopping: " + " ".join(problems))
        self.metric, self.mode, self.patience, self.min_delta = metric, mode, patience, float(min_delta)
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None

    def improved(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta

    def after_epoch(self, epoch: int, metrics: dict[str, Any]) -> None:
        if self.metric not in metrics:
            raise ModelDefinitionError(
                f"EarlyStopping watches `{self.metric}`, which the epoch did not report "
                f"(it reported {sorted(metrics)})."
            )
        value = float(metrics[self.metric])
        if self.improved(value):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            self.context.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch, self.wait = state.get("best"), state.get("best_epoch"), int(state.get("wait", 0))

    def __repr__(self) -> str:
        return (
            f"EarlyStopping(metric={self.metric!r}, mode={self.mode!r}, patience={self.patience}, "
            f"min_delta={self.min_delta})"
        )
