"""Epoch progress on the driver: a Ray Train ``UserCallback`` feeds the run's hub, the driver prints.

The callback runs in Train V2's controller actor; the run's ``RunHub`` (a
tiny actor) carries rank 0's metrics to a thread on the driver, which prints
one line per epoch while ``fit()`` blocks.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO



def format_metrics(metrics: dict[str, Any], skip: tuple[str, ...] = ("epoch", "checkpoint_path")) -> str:
    parts = []
    for key, value in metrics.items():
        if key in skip:
            continue
        parts.append(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}")
    return "  ".join(parts)


class ProgressPrinter:
    """Prints ``[Name] epoch 3/5  loss 0.1234  val_acc 0.9700  (12.3s)`` per epoch."""

    def __init__(self, hub: Any, label: str, total: int, unit: str = "epoch", stream: TextIO | None = None) -> None:
        self.hub = hub
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stdout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raymodel-progress", daemon=True)
        self._start = time.monotonic()

    def callback(self) -> Any:
        from raymodel.train._callbacks import ProgressCallback

        return ProgressCallback(self.hub)

    def __enter__(self) -> "ProgressPrinter":
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll(timeout=0.0)  # rows that arrived after the thread's last look

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poll(timeout=0.5)

    def _poll(self, timeout: float) -> None:
        import ray

        try:
            rows = ray.get(self.hub.pop.remote(timeout))
        except Exception:  # noqa: BLE001 - the hub going away ends progress output, not the run
            return
        for row in rows:
            self._print(row)

    def _print(self, row: dict[str, Any]) -> None:
        elapsed = time.monotonic() - self._start
        epoch = row.get("epoch", "?")
        print(f"[{self.label}] {self.unit} {epoch}/{self.total}  {format_metrics(row)}  ({elapsed:.1f}s)",
              file=self.stream, flush=True)
