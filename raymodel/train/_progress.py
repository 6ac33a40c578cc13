"""Epoch progress on the driver: a Ray Train ``UserCallback`` feeds a queue the driver prints from.

The callback runs in Train V2's controller actor; the queue (a tiny actor)
carries rank 0's metrics to a thread on the driver, which prints one line
per epoch while ``fit()`` blocks.
"""

from __future__ import annotations

import queue as _queue
import sys
import threading
import time
from typing import Any, TextIO

from ray.train import UserCallback


class ProgressCallback(UserCallback):
    """Forward each report's rank-0 metrics into a ``ray.util.queue.Queue``."""

    def __init__(self, q: Any) -> None:
        self.queue = q

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if metrics:
            self.queue.put_nowait(dict(metrics[0]))


def format_metrics(metrics: dict[str, Any], skip: tuple[str, ...] = ("epoch",)) -> str:
    parts = []
    for key, value in metrics.items():
        if key in skip:
            continue
        parts.append(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}")
    return "  ".join(parts)


class ProgressPrinter:
    """Prints ``[Name] epoch 3/5  loss 0.1234  val_acc 0.9700  (12.3s)`` per epoch."""

    def __init__(self, label: str, total: int, unit: str = "epoch", stream: TextIO | None = None) -> None:
        from ray.util.queue import Queue

        self.queue = Queue(actor_options={"num_cpus": 0})
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stdout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raymodel-progress", daemon=True)
        self._start = time.monotonic()

    def callback(self) -> ProgressCallback:
        return ProgressCallback(self.queue)

    def __enter__(self) -> "ProgressPrinter":
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._drain()
        import ray

        ray.kill(self.queue.actor)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                row = self.queue.get(timeout=0.5)
            except (_queue.Empty, Exception):  # ray.util.queue.Empty, or the queue going away
                continue
            self._print(row)

    def _drain(self) -> None:
        try:
            while not self.queue.empty():
                self._print(self.queue.get_nowait())
        except Exception:  # the queue actor may be gone already
            pass

    def _print(self, row: dict[str, Any]) -> None:
        elapsed = time.monotonic() - self._start
        epoch = row.get("epoch", "?")
        print(f"[{self.label}] {self.unit} {epoch}/{self.total}  {format_metrics(row)}  ({elapsed:.1f}s)",
              file=self.stream, flush=True)
