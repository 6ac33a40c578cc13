"""What a job costs over a blocking `train()`: time to the first epoch row, and the whole run.

On one warm local Ray (2 CPUs), the digits MLP on 2 workers for 5 epochs, alternating:
- blocking: `model.train(settings, data=data)`; its first row is when rank 0 ended epoch 1 (a
  callback's wall-clock stamp: the earliest any row exists; the caller sees none until the end);
- job: `model.train(settings, data=data, wait=False)`, the first row from `job.stream()`, the end
  from `job.wait()`.
Each figure is the median over `--reps` runs, with the spread (min-max).

An internal comparison: raymodel with itself (its job API against its blocking call, on the same
pool). The comparison with hand-written Ray Train is `small_jobs.py`'s and `train_overhead.py`'s.

    python benchmarks/jobs_overhead.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from digits import DigitsNet, load_data

import raymodel as rm

SETTINGS = {"num_workers": 2, "num_epochs": 5, "batch_size": 64, "progress": False}


class FirstEpoch(rm.Callback):
    """Rank 0 writes the wall-clock time its first epoch ended (the earliest a row exists)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_epoch(self, epoch, metrics):
        if epoch == 1 and self.context.rank == 0:
            Path(self.path).write_text(repr(time.time()))


def blocking(data) -> tuple[float, float]:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        marker = os.path.join(scratch, "first")
        start = time.time()
        DigitsNet().train({**SETTINGS, "callbacks": [FirstEpoch(marker)]}, data=data)
        end = time.time()
        return float(Path(marker).read_text()) - start, end - start


def job(data) -> tuple[float, float]:
    start = time.time()
    handle = DigitsNet().train(SETTINGS, data=data, wait=False)
    next(iter(handle.stream()))  # the first row, as the caller sees it
    first = time.time() - start
    handle.wait()
    return first, time.time() - start


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    X, y = load_data()
    data = rm.data.from_numpy(X, y, valid_fraction=0.2)
    rm.init(num_cpus=2)
    blocking(data)  # warm-up, both ways: the first Train run in a session pays for
    job(data)  # fresh processes' imports, and the first job for the server actor
    figures: dict[str, list[tuple[float, float]]] = {"blocking train()": [], "job (wait=False)": []}
    for rep in range(args.reps):
        order = [("blocking train()", blocking), ("job (wait=False)", job)]
        for name, fn in order if rep % 2 == 0 else reversed(order):
            figures[name].append(fn(data))
    print(
        f"-- jobs overhead: digits MLP, {SETTINGS['num_workers']} workers, {SETTINGS['num_epochs']} epochs, "
        f"{args.reps} repetitions --"
    )
    for name, runs in figures.items():
        print(f"{name:>18}: first row {spread([f for f, _ in runs])}   whole run {spread([w for _, w in runs])}")
    ratio = statistics.median(w for _, w in figures["job (wait=False)"]) / statistics.median(
        w for _, w in figures["blocking train()"]
    )
    first = statistics.median(f for f, _ in figures["job (wait=False)"]) / statistics.median(
        f for f, _ in figures["blocking train()"]
    )
    print(f"(internal) job / blocking: whole run {ratio:.3f}x (goal <= 1.05), first row {first:.3f}x")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
