"""Epoch progress on the driver: the run's hub carries rows to a thread on the driver, which shows them.

Two kinds of row reach the hub: each epoch's metrics (``HubRows``, one of the
run's ``RunEvents``, or from rank 0 itself in local mode), and, a few times a
second, rank 0's batch progress (``_progress`` rows: batches done, of how many,
the loss). In a terminal the driver draws a
live bar per epoch (batches, loss, rate, ETA) under an epoch counter (tqdm);
elsewhere (CI logs, a pipe) it prints one plain line per epoch.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from raymodel.contract import RunEvents

#: How often rank 0 sends its batch progress (seconds).
BATCH_EVERY_S = 0.25


def format_metrics(metrics: dict[str, Any], skip: tuple[str, ...] = ("epoch", "checkpoint_path")) -> str:
    parts = []
    for key, value in metrics.items():
        if key in skip or key.startswith("_"):
            continue
        if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
            parts.append(f"{key} {int(value)}")  # a count (env steps, say), not a measurement
        else:
            parts.append(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}")
    return "  ".join(parts)


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class BatchProgress:
    """On rank 0: sends ``{"_progress": True, "epoch", "batch", "total", "loss"}`` to the hub, at
    most every ``BATCH_EVERY_S`` seconds (a fire-and-forget call: training never waits)."""

    def __init__(self, hub: Any) -> None:
        self.hub, self.last = hub, 0.0

    def batch(self, epoch: int, batch_idx: int, total: int | None, outputs: Any) -> None:
        now = time.monotonic()
        if now - self.last < BATCH_EVERY_S and batch_idx + 1 != total:
            return
        self.last = now
        self.hub.push.remote(
            {"_progress": True, "epoch": epoch, "batch": batch_idx + 1, "total": total, "loss": _loss(outputs)}
        )


def _loss(outputs: Any) -> float | None:
    value: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if hasattr(value, "detach"):
        value = value.detach()
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


class HubRows(RunEvents):
    """Each report's rank-0 row (with its checkpoint's location, as ``checkpoint_path``) to a hub.

    With ``wait=True`` the report waits until the reader acknowledged the row (the run then moves
    at its reader's pace, as a Tune trial must).
    """

    def __init__(self, hub: Any, wait: bool = False) -> None:
        self.hub, self.wait = hub, wait

    def row(self, row: dict[str, Any], checkpoint: str | None) -> None:
        import ray

        if checkpoint is not None:
            row = {**row, "checkpoint_path": checkpoint}
        if self.wait:
            ray.get(self.hub.deliver.remote(row))
        else:
            self.hub.push.remote(row)


class ProgressPrinter:
    """Shows ``[Name] epoch 3/5  loss 0.1234  val_acc 0.9700  (12.3s)`` per epoch, with live bars in a terminal."""

    def __init__(self, hub: Any, label: str, total: int, unit: str = "epoch", stream: TextIO | None = None) -> None:
        self.hub = hub
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stdout
        self.live = is_terminal(self.stream)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raymodel-progress", daemon=True)
        self._start = time.monotonic()
        self._epochs: Any = None  # tqdm bars, in a terminal
        self._batches: Any = None

    def events(self) -> HubRows:
        """What the run tells of its rows, for this printer."""
        return HubRows(self.hub)

    def __enter__(self) -> ProgressPrinter:
        self._start = time.monotonic()
        if self.hub is not None:  # without a hub, rows come to ``show``
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.hub is not None:
            self._thread.join(timeout=5)
            self._poll(timeout=0.0)  # rows that arrived after the thread's last look
        for bar in (self._batches, self._epochs):
            if bar is not None:
                bar.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poll(timeout=0.5)

    def _poll(self, timeout: float) -> None:
        import ray

        try:
            rows = ray.get(self.hub.pop.remote(timeout))
        except Exception:  # noqa: BLE001 - the hub going away ends progress output, not the run
            return
        self.show(rows)

    def show(self, rows: list[dict[str, Any]]) -> None:
        """Show ``rows`` of the run (epoch rows, and batches' progress in a terminal)."""
        for row in rows:
            if row.get("_progress"):
                if self.live:
                    self._batch(row)
            else:
                self._print(row)

    def _bars(self) -> None:
        from tqdm.auto import tqdm

        if self._epochs is None:
            self._epochs = tqdm(
                total=self.total,
                desc=f"[{self.label}] {self.unit}s",
                unit=self.unit,
                position=0,
                file=self.stream,
                dynamic_ncols=True,
            )

    def _batch(self, row: dict[str, Any]) -> None:
        from tqdm.auto import tqdm

        self._bars()
        if self._batches is None or self._batches.desc != f"{self.unit} {row['epoch']}":
            if self._batches is not None:
                self._batches.close()
            self._batches = tqdm(
                total=row.get("total"),
                desc=f"{self.unit} {row['epoch']}",
                unit="batch",
                position=1,
                leave=False,
                file=self.stream,
                dynamic_ncols=True,
            )
        self._batches.update(row["batch"] - self._batches.n)
        if row.get("loss") is not None:
            self._batches.set_postfix(loss=f"{row['loss']:.4f}", refresh=True)

    def _print(self, row: dict[str, Any]) -> None:
        elapsed = time.monotonic() - self._start
        epoch = row.get("epoch", "?")
        line = f"[{self.label}] {self.unit} {epoch}/{self.total}  {format_metrics(row)}  ({elapsed:.1f}s)"
        if not self.live:
            print(line, file=self.stream, flush=True)
            return
        self._bars()
        if self._batches is not None:
            self._batches.close()
            self._batches = None
        self._epochs.write(line, file=self.stream)
        self._epochs.update(1)
