"""A line per finished trial, and a summary table of the best trials at the end."""

from __future__ import annotations

import sys
from typing import Any

from ray.tune import Callback

from raymodel.train import is_terminal


class TrialPrinter(Callback):
    """Runs on the driver inside Tune's loop; prints when a trial ends."""

    def __init__(
        self, label: str, space_keys: list[str], metric: str, max_epochs: int, total: int | None = None
    ) -> None:
        # No stream is kept: Tune pickles its callbacks with the experiment state (and drops the bar).
        self.label, self.space_keys, self.metric, self.max_epochs = label, space_keys, metric, max_epochs
        self.done, self.total = 0, total
        self._bar: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_bar": None}

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._line(trial, error=False)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._line(trial, error=True)

    def _line(self, trial: Any, error: bool) -> None:
        self.done += 1
        result = trial.last_result or {}
        epochs = int(result.get("epoch", result.get("training_iteration", 0)))
        value = result.get(self.metric)
        shown = f"{value:.4f}" if isinstance(value, float) else "n/a"
        config = ", ".join(f"{k}={_short(trial.config.get(k))}" for k in self.space_keys)
        if error:
            status = "ERROR"
        elif epochs < self.max_epochs:
            status = "stopped early"
        else:
            status = "completed"
        line = (
            f"[{self.label}] trial {self.done} {trial.trial_id}  {config}  {self.metric} {shown}  "
            f"epochs {epochs}/{self.max_epochs}  {status}"
        )
        if not is_terminal(sys.stdout):
            print(line, file=sys.stdout, flush=True)
            return
        if self._bar is None:  # in a terminal: a bar of finished trials under the trial lines
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=self.total,
                desc=f"[{self.label}] trials",
                unit="trial",
                file=sys.stdout,
                dynamic_ncols=True,
                initial=self.done - 1,
            )
        self._bar.write(line, file=sys.stdout)
        self._bar.update(1)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def summary_table(rows: list[dict[str, Any]], space_keys: list[str], metric: str, mode: str, top: int = 5) -> str:
    ranked = sorted(
        (r for r in rows if isinstance(r.get(metric), (int, float))), key=lambda r: r[metric], reverse=mode == "max"
    )[:top]
    headers = ["rank", "trial", *space_keys, metric, "epochs", "stopped early"]
    body = [
        [
            str(i + 1),
            r["trial_id"],
            *(_short(r.get(f"config/{k}")) for k in space_keys),
            f"{r[metric]:.4f}",
            str(r["epochs"]),
            "yes" if r["stopped_early"] else "no",
        ]
        for i, r in enumerate(ranked)
    ]
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
    return "\n".join(lines)
