"""``TuneResult``: what ``model.tune()`` returns."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The outcome of a tuning experiment.

    Attributes:
        best_config: The full model config of the best trial.
        best_metrics: That trial's last reported metrics.
        best_checkpoint: Path or URI of that trial's final checkpoint.
        num_trials: How many trials ran.
        path: The experiment's folder (pass ``settings.name`` and ``resume=True`` to continue it).
        metric, mode: What was optimized.
        trials: One dict per trial (``dataframe()`` shows them as a table).
        curves: Each trial's ``metric`` by epoch: ``{trial_id: [[epoch, value], ...]}``.
    """

    best_config: dict[str, Any]
    best_metrics: dict[str, Any]
    best_checkpoint: str | None
    num_trials: int
    path: str
    metric: str
    mode: str
    trials: list[dict[str, Any]]
    best_trial_id: str = ""
    curves: dict[str, list[list[float]]] = dataclasses.field(default_factory=dict)

    def dataframe(self) -> Any:
        """One row per trial: ``trial_id``, ``config/<key>`` columns, final metrics,
        ``epochs``, ``stopped_early`` and ``status``; sorted best first."""
        import pandas as pd

        frame = pd.DataFrame(self.trials)
        if self.metric in frame.columns:
            frame = frame.sort_values(self.metric, ascending=self.mode == "min", na_position="last")
        return frame.reset_index(drop=True)

    def plot(self, path: str | None = None) -> Any:
        """Every trial's ``metric`` by epoch on one chart: the best trial highlighted, trials that
        were stopped early marked with an ×. Returns the matplotlib ``Figure``; with ``path``,
        also saves it as a PNG there."""
        from raymodel._internal.plots import tune_figure

        return tune_figure(self, path)

    def __repr__(self) -> str:
        value = self.best_metrics.get(self.metric)
        shown = f"{value:.4g}" if isinstance(value, float) else value
        return f"TuneResult(best {self.metric}={shown}, best_config={self.best_config!r}, num_trials={self.num_trials})"
