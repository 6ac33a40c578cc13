"""Batch inference: `model.predict_batch` against the hand-written Ray Data code, and a plain loop.

The data: `--rows` (default 1,000,000) generated rows of 64 float32 columns, written once as
Parquet files (by Ray Data, streaming). The model: the digits MLP of the serving benchmark
(64 -> 256 -> 10), random weights. Every side reads the same files, uses the same batch size, and
streams its output through the driver (`iter_batches`: rows counted, predictions summed), so
nothing is gathered whole:

- raymodel: `model.predict_batch(folder, batch_size=B, concurrency=C, num_cpus=K)`;
- hand-written: `ray.data.read_parquet(folder).map_batches(HandWritten, ...)`, the class a user
  writes today (load the weights in `__init__`, stack the columns, `inference_mode`, numpy out),
  with the same pool (`ActorPoolStrategy(size=C)`, `num_cpus=K`) and batch size;
- plain loop: one process, `pyarrow` reading the files batch by batch, torch on every core.

After one untimed warm-up of each side (50,000 rows), the sides alternate for `--reps` rounds,
each side first in turn; each figure is the median rows/s, with the driver's peak RSS above its
level before the run (sampled every 10 ms). Both Ray sides' predictions are checked
to sum to the same total (the hand-written side does not keep the rows' order).

    python benchmarks/batch_inference.py [--rows 1000000] [--reps 3] [--batch-size 4096]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

import raymodel as rm

FEATURES = [f"f{i}" for i in range(64)]


class DigitsMLP(rm.RayTorchModel):
    def setup(self, config):
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


class HandWritten:
    """What a user writes for Ray Data today."""

    def __init__(self, weights: str) -> None:
        torch.set_num_threads(1)
        self.net = build()
        self.net.load_state_dict(torch.load(weights))
        self.net.eval()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = torch.as_tensor(np.column_stack([batch[name] for name in FEATURES]).astype(np.float32))
        with torch.inference_mode():
            return {"prediction": self.net(x).numpy()}


def generate(folder: str, rows: int) -> None:
    import ray.data

    def features(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(int(batch["id"][0]))
        values = rng.standard_normal((len(batch["id"]), 64), dtype=np.float32)
        return {name: values[:, i] for i, name in enumerate(FEATURES)}

    ray.data.range(rows, override_num_blocks=max(1, rows // 50_000)).map_batches(
        features, batch_size=None
    ).write_parquet(folder)


def rss() -> int:
    """This process's resident memory in bytes (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The driver's peak resident memory above its level at the start, sampled every 10 ms."""

    def __enter__(self) -> PeakRSS:
        self.base = self.peak = rss()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.01):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    @property
    def above_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def drain(dataset, column: str = "prediction") -> tuple[int, float]:
    """Stream a dataset through the driver: (rows, sum of the predictions)."""
    rows, total = 0, 0.0
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        values = batch[column]
        rows += len(values)
        total += float(values.sum(dtype=np.float64))
    return rows, total


def plain_loop(folder: str, batch_size: int, weights: str) -> int:
    import pyarrow.dataset

    torch.set_num_threads(os.cpu_count() or 1)
    net = build()
    net.load_state_dict(torch.load(weights))
    net.eval()
    rows = 0
    for record_batch in pyarrow.dataset.dataset(folder, format="parquet").to_batches(batch_size=batch_size):
        x = np.column_stack([record_batch.column(name).to_numpy() for name in FEATURES])
        with torch.inference_mode():
            rows += len(net(torch.as_tensor(x)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--num-cpus", type=float, default=0.5)
    args = parser.parse_args()
    import ray
    import ray.data

    rm.init()
    ray.data.DataContext.get_current().enable_progress_bars = False
    scratch = tempfile.mkdtemp(prefix="batch-inference-")
    folder = os.path.join(scratch, "features")
    began = time.monotonic()
    generate(folder, args.rows)
    print(
        f"{args.rows:,} rows x 64 float32 columns written as Parquet in {time.monotonic() - began:.1f} s; "
        f"batch size {args.batch_size}, {args.concurrency} actors x {args.num_cpus} CPU, "
        f"{int(ray.cluster_resources().get('CPU', 0))} CPUs"
    )
    model = DigitsMLP()
    model.ensure_setup()
    weights = os.path.join(scratch, "weights.pt")
    torch.save(model.net.state_dict(), weights)
    pool = {"batch_size": args.batch_size, "num_cpus": args.num_cpus}

    def ours():
        return model.predict_batch(folder, concurrency=args.concurrency, **pool)

    def ours_unordered():
        return model.predict_batch(folder, concurrency=args.concurrency, preserve_order=False, **pool)

    def theirs():
        return ray.data.read_parquet(folder).map_batches(
            HandWritten,
            fn_constructor_kwargs={"weights": weights},
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=args.concurrency),
            **pool,
        )

    sides = {
        "raymodel predict_batch": ours,
        "hand-written map_batches": theirs,
        "raymodel, preserve_order=False": ours_unordered,
    }
    rates: dict[str, list[float]] = {name: [] for name in sides}
    memory: dict[str, list[float]] = {name: [] for name in sides}
    sums: dict[str, float] = {}
    for make in sides.values():  # warm-up, untimed: the driver's first Ray Data run starts its executor
        drain(make().limit(50_000))
    names = list(sides)
    for rep in range(args.reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:  # each side goes first in turn
            make = sides[name]
            with PeakRSS() as peak:
                start = time.monotonic()
                rows, sums[name] = drain(make())
                seconds = time.monotonic() - start
            assert rows == args.rows, (name, rows)
            rates[name].append(rows / seconds)
            memory[name].append(peak.above_mib)
            print(
                f"  {name}: {rows / seconds:,.0f} rows/s ({seconds:.1f} s), driver peak +{peak.above_mib:.0f} MiB",
                flush=True,
            )
    # Same predictions (the hand-written side does not keep the rows' order: compare the sums).
    assert abs(sums["raymodel predict_batch"] - sums["hand-written map_batches"]) <= 1e-4 * args.rows, sums
    with PeakRSS() as peak:
        start = time.monotonic()
        assert plain_loop(folder, args.batch_size, weights) == args.rows
        loop_rate = args.rows / (time.monotonic() - start)

    ours_rate, theirs_rate = (
        statistics.median(rates["raymodel predict_batch"]),
        statistics.median(rates["hand-written map_batches"]),
    )
    print(f"\n{'side':<32}{'rows/s (median)':>18}{'spread':>24}{'driver peak RSS':>18}")
    for name in sides:
        spread = f"{min(rates[name]):,.0f}-{max(rates[name]):,.0f}"
        print(f"{name:<32}{statistics.median(rates[name]):>18,.0f}{spread:>24}{max(memory[name]):>14.0f} MiB")
    print(f"{'plain loop, one process':<32}{loop_rate:>18,.0f}{'':>24}{peak.above_mib:>14.0f} MiB")
    print(f"\npredict_batch / hand-written map_batches: {ours_rate / theirs_rate:.3f}x (goal >= 1.0)")
    unordered = statistics.median(rates["raymodel, preserve_order=False"])
    print(
        f"predict_batch(preserve_order=False) / hand-written map_batches: {unordered / theirs_rate:.3f}x "
        "(the hand-written code does not keep the rows' order either)"
    )
    print(f"predict_batch / plain loop: {ours_rate / loop_rate:.3f}x")
    print(
        f"driver resident memory now {rss() / 2**20:.0f} MiB; the data on disk is "
        f"{sum(f.stat().st_size for f in Path(folder).iterdir()) / 2**20:.0f} MiB"
    )
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
