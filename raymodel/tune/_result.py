"""``TuneResult``: what ``model.tune()`` returns, and how it is read from Tune's results."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any

from raymodel._internal import storage
from raymodel.exceptions import TuneError
from raymodel.tune._reported import is_reported
from raymodel.tune._trial import TRAIN_PREFIX

if TYPE_CHECKING:
    from raymodel.tune._settings import TuneSettings


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
        from raymodel.train import tune_figure

        return tune_figure(self, path)

    def __repr__(self) -> str:
        value = self.best_metrics.get(self.metric)
        shown = f"{value:.4g}" if isinstance(value, float) else value
        return f"TuneResult(best {self.metric}={shown}, best_config={self.best_config!r}, num_trials={self.num_trials})"


def collect(
    results: Any, metric: str, settings: TuneSettings, space_keys: list[str], path: str, root: str
) -> TuneResult:
    """The experiment's ``TuneResult``, from Tune's results (no file is read: trials may have run
    on other nodes); locations keep the storage's scheme, which Ray's ``Result.path`` drops."""
    rows, reported, curves = [], set(), {}
    for r in results:
        metrics: dict[str, Any] = dict(r.metrics or {})
        reported |= {k for k in metrics if is_reported(k)}
        # Our own epoch count: a trial resumed from its Train checkpoint restarts Tune's iteration count.
        epochs = int(metrics.get("epoch", metrics.get("training_iteration", 0)))
        planned = int((r.config or {}).get(f"{TRAIN_PREFIX}num_epochs", settings.max_epochs))
        row = {
            "trial_id": metrics.get("trial_id") or os.path.basename(r.path),
            **{f"config/{k}": (r.config or {}).get(k) for k in space_keys},
            **{k: v for k, v in metrics.items() if is_reported(k)},
            "epochs": epochs,
            "stopped_early": r.error is None and epochs < planned,
            "status": "ERROR" if r.error is not None else "TERMINATED",
            "checkpoint": metrics.get("checkpoint_path"),
            "path": storage.rebase(root, r.path),
            "error": None if r.error is None else str(r.error).strip().splitlines()[-1],
        }
        rows.append(row)
        curves[row["trial_id"]] = curve(r, metric)
    ok = [r for r in rows if isinstance(r.get(metric), (int, float)) and not math.isnan(r[metric])]
    if not ok:
        errors = [r["error"] for r in rows if r["error"]]
        if errors:
            raise TuneError(f"All {len(rows)} trials failed; the first error: {errors[0]}")
        raise TuneError(
            f"No trial reported `{metric}`. The model reports: {sorted(reported) or 'nothing'}. "
            f"Set `TuneSettings(metric=...)` to one of those."
        )
    best = (min if settings.mode == "min" else max)(ok, key=lambda r: r[metric])
    best_result = next(r for r in results if storage.rebase(root, r.path) == best["path"])
    best_metrics = {k: v for k, v in (best_result.metrics or {}).items() if is_reported(k)}
    return TuneResult(
        best_config=dict(best_result.config),
        best_metrics=best_metrics,
        best_checkpoint=best["checkpoint"],
        num_trials=len(rows),
        path=path,
        metric=metric,
        mode=settings.mode,
        trials=rows,
        best_trial_id=best["trial_id"],
        curves=curves,
    )


def curve(result: Any, metric: str) -> list[list[float]]:
    """``[[epoch, value], ...]`` of ``metric`` for one trial (a restarted trial's repeats: the last)."""
    frame = getattr(result, "metrics_dataframe", None)
    if frame is None or metric not in frame.columns or "epoch" not in frame.columns:
        return []
    by_epoch = {int(e): float(v) for e, v in zip(frame["epoch"], frame[metric]) if v == v and e == e}
    return [[e, by_epoch[e]] for e in sorted(by_epoch)]
