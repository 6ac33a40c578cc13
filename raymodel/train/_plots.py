"""``TrainResult.plot`` and ``TuneResult.plot``: matplotlib figures, no display needed.

The figures are built on ``matplotlib.figure.Figure`` directly (not pyplot),
so plotting never changes the user's backend or opens a window; a notebook
shows the returned figure, ``path`` saves a PNG.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from raymodel.exceptions import MissingDependencyError


def _figure(width: float, height: float, panels: int) -> tuple[Any, list[Any]]:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError("Plots need matplotlib: pip install 'raymodel[plots]'") from exc
    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots(1, panels, squeeze=False)[0]
    return figure, list(axes)


def _save(figure: Any, path: str | None) -> Any:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=110)
    return figure


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def train_figure(result: Any, path: str | None) -> Any:
    """Loss (training and validation) per epoch; the other validation metrics beside it."""
    history = result.history
    keys = sorted({k for row in history for k, v in row.items() if k != "epoch" and _numeric(v)})
    losses = [k for k in keys if "loss" in k]
    others = [k for k in keys if k not in losses]
    second = "validation metrics"
    if any(k.startswith("episode_") for k in keys):  # reinforcement learning: the returns, not the step counts
        others, second = [k for k in keys if k.startswith("episode_")], "episodes"
    figure, axes = _figure(11 if others else 6, 4, 2 if others else 1)
    for ax, group, title in zip(axes, (losses, others), ("loss", second)):
        for key in group:
            points = [(row["epoch"], row[key]) for row in history if _numeric(row.get(key))]
            ax.plot([e for e, _ in points], [v for _, v in points], marker="o", markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if group:
            ax.legend()
    figure.suptitle(f"{result.name}: {len(history)} epochs")
    return _save(figure, path)


def tune_figure(result: Any, path: str | None) -> Any:
    """Every trial's metric by epoch; the best bold, the early-stopped ended with an ×."""
    figure, (ax,) = _figure(8, 4.5, 1)
    stopped = {t["trial_id"] for t in result.trials if t.get("stopped_early")}
    for trial_id, curve in sorted(result.curves.items()):
        if not curve:
            continue
        epochs, values = [e for e, _ in curve], [v for _, v in curve]
        best = trial_id == result.best_trial_id
        (line,) = ax.plot(
            epochs,
            values,
            linewidth=3 if best else 1.2,
            alpha=1 if best else 0.75,
            label=f"{trial_id} (best)" if best else trial_id,
            zorder=3 if best else 2,
        )
        if trial_id in stopped:
            ax.plot(epochs[-1:], values[-1:], marker="x", markersize=9, color=line.get_color(), zorder=4)
    ax.set_xlabel("epoch")
    ax.set_ylabel(result.metric)
    ax.grid(alpha=0.3)
    ax.set_title(f"{result.num_trials} trials, {result.metric} ({result.mode}); × stopped early")
    if len(result.curves) <= 12:
        ax.legend(fontsize=8)
    return _save(figure, path)
