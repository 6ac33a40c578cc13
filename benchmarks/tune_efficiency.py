"""Tuning: ASHA vs FIFO, and `model.tune` vs a hand-written Tuner + TorchTrainer.

1. ASHA vs FIFO on the same space, seed and num_samples: the best val_loss each
   reaches and the epochs each consumes in total.
2. `model.tune` vs a hand-written `Tuner` over a function that runs a
   `TorchTrainer` (the same trials: a fixed grid, FIFO, same epochs, workers
   and resources): wall-time ratio, alternating, median.

    python benchmarks/tune_efficiency.py [--samples 8] [--epochs 6] [--pairs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import raymodel as rm  # noqa: E402
from digits import DigitsNet, load_data  # noqa: E402
from train_overhead import hand_written_loop  # noqa: E402

TRIAL = {"resources_per_worker": {"CPU": 0.95}, "batch_size": 64, "progress": False}


def asha_vs_fifo(data, samples: int, epochs: int) -> None:
    print(f"-- ASHA vs FIFO: {samples} trials, up to {epochs} epochs, seed 0 --")
    for scheduler in ("asha", "fifo"):
        start = time.perf_counter()
        result = DigitsNet().tune(settings=rm.TuneSettings(num_samples=samples, max_epochs=epochs, scheduler=scheduler,
                                                           seed=0, metric="val_loss", train=TRIAL, progress=False),
                                  data=data)
        frame = result.dataframe()
        print(f"{scheduler:>5}: best val_loss {result.best_metrics['val_loss']:.4f}  "
              f"epochs consumed {int(frame['epochs'].sum()):>3}  stopped early {int(frame['stopped_early'].sum())}"
              f"  wall {time.perf_counter() - start:.1f}s")


def hand_written_tune(data, grid, epochs: int) -> float:
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    import ray

    tr, va = data.splits["train"], data.splits["valid"]
    refs = [ray.put(a) for a in (tr.x, tr.y, va.x, va.y)]

    def trial(config):
        trainer = TorchTrainer(hand_written_loop,
                               train_loop_config={**config, "batch_size": 64, "epochs": epochs, "refs": refs},
                               scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.95}),
                               run_config=RunConfig(storage_path=tune.get_context().get_trial_dir(), name="train",
                                                    callbacks=[TuneReportCallback()]))
        trainer.fit()

    from raymodel._internal.runtime import runs_root

    tuner = tune.Tuner(tune.with_resources(trial, {"CPU": 0.01}),
                       param_space={"hidden": 64, "lr": tune.grid_search(grid)},
                       tune_config=tune.TuneConfig(metric="val_loss", mode="min", max_concurrent_trials=2),
                       run_config=tune.RunConfig(storage_path=runs_root(), name=f"hand-tune-{time.time_ns()}",
                                                 verbose=0))
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


def raymodel_tune(data, grid, epochs: int) -> float:
    start = time.perf_counter()
    DigitsNet(config={"hidden": 64}).tune({"lr": rm.tune.grid_search(grid)}, data=data, settings=rm.TuneSettings(
        num_samples=1, max_epochs=epochs, scheduler="fifo", metric="val_loss", train=TRIAL, progress=False))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    X, y = load_data()
    data = rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)
    rm.init(num_cpus=2)
    asha_vs_fifo(data, args.samples, args.epochs)

    grid = [1e-3, 3e-3, 1e-2, 3e-2]
    print(f"-- model.tune vs hand-written Tuner + TorchTrainer: grid of {len(grid)} lrs, FIFO, "
          f"{args.epochs} epochs --")
    ratios = []
    for i in range(args.pairs):
        if i % 2 == 0:
            ours, theirs = raymodel_tune(data, grid, args.epochs), hand_written_tune(data, grid, args.epochs)
        else:
            theirs, ours = hand_written_tune(data, grid, args.epochs), raymodel_tune(data, grid, args.epochs)
        ratios.append(ours / theirs)
        print(f"pair {i + 1}: raymodel {ours:.1f}s  hand-written {theirs:.1f}s  ratio {ours / theirs:.3f}")
    print(f"median wall-time ratio raymodel / hand-written: {statistics.median(ratios):.3f} (target <= 1.05)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
