"""`model.train` (a one-off run: `pool=False`) vs a hand-written Ray Train `TorchTrainer` loop doing the same work.

Both start a worker group per run; `benchmarks/small_jobs.py` measures runs on the training
server's warm pools instead.

Same model (the digits MLP), data, epochs, workers, batch size; both validate
and checkpoint every epoch and report per-epoch metrics. The two alternate in
one Ray instance; the script prints each pair and the median wall-time ratio.

    python benchmarks/train_overhead.py [--pairs 5] [--epochs 5] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsNet
from hand_torch import hand_written_loop

import raymodel as rm


def run_hand_written(data, settings) -> float:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    tr, va = data.splits["train"], data.splits["valid"]
    refs = [ray.put(a) for a in (tr.x, tr.y, va.x, va.y)]
    config = {"hidden": 64, "lr": 1e-3, "batch_size": settings.batch_size, "epochs": settings.num_epochs, "refs": refs}
    trainer = TorchTrainer(
        hand_written_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=settings.num_workers),
        run_config=RunConfig(storage_path=os.path.join(rm_home(), "bench"), name=f"hand-{time.time_ns()}"),
    )
    start = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - start
    assert result.error is None
    return elapsed


def run_raymodel(data, settings) -> float:
    start = time.perf_counter()
    DigitsNet(config={"hidden": 64, "lr": 1e-3}).train(settings, data=data)
    return time.perf_counter() - start


def rm_home() -> str:
    from raymodel._internal.locations import home

    return home()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    X, y = load_digits(return_X_y=True)
    data = rm.data.from_numpy((X / 16.0).astype(np.float32), y, valid_fraction=0.2)
    settings = rm.TrainSettings(
        num_workers=args.workers, num_epochs=args.epochs, batch_size=64, progress=False, pool=False
    )
    rm.init(num_cpus=max(2, args.workers))
    run_raymodel(data, settings)  # warm-up: worker processes import torch once
    print(f"{args.pairs} pairs, {args.workers} workers, {args.epochs} epochs, digits MLP")
    print(f"{'pair':>4}  {'raymodel s':>10}  {'hand-written s':>14}  {'ratio':>6}")
    ratios = []
    for i in range(args.pairs):
        if i % 2 == 0:  # alternate which goes first
            ours, theirs = run_raymodel(data, settings), run_hand_written(data, settings)
        else:
            theirs, ours = run_hand_written(data, settings), run_raymodel(data, settings)
        ratios.append(ours / theirs)
        print(f"{i + 1:>4}  {ours:>10.2f}  {theirs:>14.2f}  {ours / theirs:>6.3f}")
    print(
        f"median wall-time ratio raymodel / hand-written: {statistics.median(ratios):.3f} (target <= 1.05, goal 1.03)"
    )


if __name__ == "__main__":
    main()
