"""A large array job: the driver's and the workers' peak memory, raymodel against hand-written.

``--rows`` x 64 float32 features (default 4,000,000 rows: 977 MB) and int64 labels, 2 workers,
one epoch of a small MLP (batch 4096), on one local Ray (2 CPUs):

- **hand-written**: a ``TorchTrainer`` whose loop gets the arrays from ``ray.put`` references (the
  object store's one copy), each worker taking every other row;
- **raymodel**: ``model.train(settings, data=(X, y))``, a job of the training server: the arrays
  are written once to the job's storage as ``.npy`` files, the job's runner puts them in the object
  store from memory maps, the workers get references.

A thread samples the driver's resident memory every 10 ms (growth over what it held before the
call) and the training workers' (``ray::RayTrainWorker`` processes, the largest one: resident,
and its own, i.e. less the object store's shared pages; a warm pool's workers still map the pages
an earlier job's data used, so their resident size counts both). Each run
starts cold on a quiet cluster (no pool, every CPU free). Goals: the
driver's peak growth <= 1.3x the data's size; the workers' peak no worse than hand-written's (within
5 %); wall time <= 1.05x. raymodel runs three ways: on a pool started for the job (a cold
pool costs its start, once), on that pool warm, and as a one-off
run (``pool=False``, a Ray Train run of its own as hand-written's). Hand-written runs first and
last (its wall time is the mean of the two, so that neither pays the machine's warming alone).

    python benchmarks/driver_memory.py [--rows 4000000]
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import psutil
import torch
import torch.nn as nn
import torch.nn.functional as F

import raymodel as rm

FEATURES, BATCH = 64, 4096
MB = 1 << 20


class Wide(rm.RayTorchModel):
    default_config = {"lr": 0.01}

    def setup(self, config):
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 2))

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=self.config["lr"])

    def forward(self, x):
        return self.net(x)

    def train_step(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y)


class Peaks:
    """The driver's and the training workers' resident memory, sampled in a thread."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.base = self.me.memory_info().rss
        self.driver = self.base
        self.worker = 0
        self.private = 0  # the worker's own memory: resident less shared (the object store's pages)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.is_set():
            self.driver = max(self.driver, self.me.memory_info().rss)
            for proc in psutil.process_iter(["cmdline", "memory_info"]):
                cmd = " ".join(proc.info["cmdline"] or ())
                info = proc.info["memory_info"]
                if "RayTrainWorker" in cmd and info is not None:
                    self.worker = max(self.worker, info.rss)
                    self.private = max(self.private, info.rss - info.shared)
            time.sleep(0.01)

    def __enter__(self) -> Peaks:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


def loop(config):
    import ray
    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    X, y = ray.get(config["x"]), ray.get(config["y"])  # zero-copy views of the object store's copy
    net = ray.train.torch.prepare_model(nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 2)))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    rows = np.arange(rank, len(X), world)
    for i in range(0, len(rows), BATCH):
        idx = rows[i : i + BATCH]
        optimizer.zero_grad()
        F.cross_entropy(net(torch.from_numpy(X[idx])), torch.from_numpy(y[idx])).backward()
        optimizer.step()
    ray.train.report({"rows": len(rows)})


def settle() -> None:
    """Both start cold, on a quiet cluster: no pool of the training server, every CPU free (a run's
    workers are released a moment after it returns)."""
    import ray

    rm.jobs.release_pools()
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0.0) < 2.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)


def hand_written(X: np.ndarray, y: np.ndarray) -> tuple[float, Peaks]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    settle()
    with Peaks() as peaks:
        start = time.perf_counter()
        refs = {"x": ray.put(X), "y": ray.put(y)}
        trainer = TorchTrainer(
            loop,
            train_loop_config=refs,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path="/tmp/raymodel-bench-hand", name=f"hand-{time.time_ns()}"),
        )
        trainer.fit()
        wall = time.perf_counter() - start
        del refs
    return wall, peaks


def with_raymodel(X: np.ndarray, y: np.ndarray, pool: str) -> tuple[float, Peaks]:
    """``pool``: "cold" (a pool started for the job), "warm" (the pool of the run before) or
    "one-off" (``pool=False``: a Ray Train run of its own, as hand-written's)."""
    if pool != "warm":
        settle()
    settings = {"num_workers": 2, "num_epochs": 1, "batch_size": BATCH, "shuffle": False, "progress": False}
    with Peaks() as peaks:
        start = time.perf_counter()
        result = Wide().train({**settings, "pool": pool != "one-off"}, data={"train": (X, y)})
        wall = time.perf_counter() - start
    assert [row["epoch"] for row in result.history] == [1]
    return wall, peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.rows, FEATURES)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    size = (X.nbytes + y.nbytes) / MB
    rm.init(num_cpus=2)
    hand_1, hand_peaks = hand_written(X, y)
    runs = {pool: with_raymodel(X, y, pool) for pool in ("cold", "warm", "one-off")}
    hand_2, _ = hand_written(X, y)
    hand = (hand_1 + hand_2) / 2
    print(f"data: {args.rows:,} rows x {FEATURES} float32 + int64 labels = {size:,.0f} MB; 2 workers, 1 epoch")
    heads = ("driver growth MB", 17), ("x data", 7), ("worker peak MB", 15), ("own MB", 7), ("wall s", 7), ("x hand", 7)
    print(f"{'':32} " + " ".join(f"{h:>{w}}" for h, w in heads))
    rows = [("hand-written (ray.put)", hand_peaks, hand)]
    for pool, (wall, peaks) in runs.items():
        rows.append((f"raymodel, {pool} pool" if pool != "one-off" else "raymodel, one-off run", peaks, wall))
    for name, peaks, wall in rows:
        growth = (peaks.driver - peaks.base) / MB
        print(
            f"{name:32} {growth:17,.0f} {growth / size:7.2f} {peaks.worker / MB:15,.0f} "
            f"{peaks.private / MB:7,.0f} {wall:7.1f} {wall / hand:7.2f}"
        )
    worst_driver = max((p.driver - p.base) / MB / size for _, p in runs.values())
    fresh_worker = max(runs[k][1].worker for k in ("cold", "one-off")) / max(hand_peaks.worker, 1)
    worst_own = max(p.private for _, p in runs.values()) / max(hand_peaks.private, 1)
    print(
        f"raymodel: driver growth <= {worst_driver:.2f}x the data (goal <= 1.3x); workers' peak {fresh_worker:.2f}x "
        f"hand-written's in fresh workers (goal <= 1.05x; their own memory <= {worst_own:.2f}x: raymodel's code); wall "
        f"{runs['one-off'][0] / hand:.2f}x hand-written's as a one-off run (goal <= 1.05x), "
        f"{runs['cold'][0] / hand:.2f}x on a pool started for it, {runs['warm'][0] / hand:.2f}x on a warm pool "
        f"(hand-written {hand_1:.1f} s and {hand_2:.1f} s)"
    )


if __name__ == "__main__":
    main()
