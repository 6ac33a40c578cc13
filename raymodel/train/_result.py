"""``TrainResult``: what ``model.train()`` returns."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """The outcome of one training run.

    Attributes:
        metrics: The last epoch's metrics (``epoch``, ``loss``, validation metrics).
        history: One dict per epoch, in order, each with ``epoch`` and ``loss``
            (the mean training loss over all workers' batches) plus validation
            metrics when there is a validation split.
        checkpoint: Path or URI of the final checkpoint.
        best_checkpoint: The checkpoint with the best ``settings.metric``
            (``None`` when no metric was given).
        path: The run's folder (Ray Train's run directory).
        config: The model config the run trained with.
        name: The run's name.
    """

    metrics: dict[str, float]
    history: list[dict[str, float]]
    checkpoint: str | None
    best_checkpoint: str | None
    path: str
    config: dict[str, Any]
    name: str

    def steps(self) -> list[dict[str, float]]:
        """Each training step's row, where the backend logs per step (post-training: ``step``, ``epoch``,
        ``loss`` and TRL's figures, e.g. ``reward``, ``kl``), read from the final checkpoint; ``[]`` for a
        backend that reports per epoch only, or a run without a checkpoint."""
        import json

        from raymodel._internal import storage
        from raymodel.contract import checkpoint

        if self.checkpoint is None:
            return []
        manifest = json.loads(storage.read_bytes(storage.join(self.checkpoint, checkpoint.MANIFEST)))
        return list(manifest.get("steps", []))

    def plot(self, path: str | None = None) -> Any:
        """The learning curves: training and validation loss per epoch, and each other validation
        metric. Returns the matplotlib ``Figure``; with ``path``, also saves it as a PNG there."""
        from raymodel.train._plots import train_figure

        return train_figure(self, path)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.metrics.items())
        return f"TrainResult({shown}, epochs={len(self.history)}, checkpoint={self.checkpoint!r})"
