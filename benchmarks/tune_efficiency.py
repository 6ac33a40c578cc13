"""Tuning at the speed of the epochs: ASHA vs FIFO, and `model.tune` vs hand-written Ray code.

Every figure is the median over `--reps` repetitions (ASHA's choices vary with timing), with the
spread (min-max) beside it:

1. ASHA vs FIFO on the same space, seed and trials (8 trials, up to 6 epochs, digits): the epochs
   each consumes, the wall time, their ratio, and the best val_loss each reaches; then the same
   search with epochs ten times as long (each epoch sees the training rows 10 times), where the
   epochs rather than Tune's fixed start-up decide the wall time.
2. The same 4-trial grid (FIFO, 6 epochs, one worker a trial), run by `model.tune`, by a hand-written
   `Tuner` whose trials start a `TorchTrainer` (a Train worker group each), and by a hand-written
   plain Tune function trainable (the training loop in the trial, no Train), in alternating order;
   and the pure compute: the same trials' epochs back to back in one process, without Ray.

    python benchmarks/tune_efficiency.py [--reps 3] [--samples 8] [--epochs 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsNet, load_data
from train_overhead import hand_written_loop

import raymodel as rm

TRIAL = {"resources_per_worker": {"CPU": 0.95}, "batch_size": 64, "progress": False}
GRID = [1e-3, 3e-3, 1e-2, 3e-2]


def spread(values: list[float], unit: str = "s") -> str:
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def asha_vs_fifo(data, reps: int, samples: int, epochs: int, label: str) -> None:
    print(f"-- 1. ASHA vs FIFO, {label}: {samples} trials, up to {epochs} epochs, seed 0, {reps} repetitions --")
    figures: dict[str, dict[str, list[float]]] = {"asha": {}, "fifo": {}}
    for _ in range(reps):
        for scheduler in ("asha", "fifo"):
            start = time.perf_counter()
            result = DigitsNet().tune(
                settings=rm.TuneSettings(
                    num_samples=samples,
                    max_epochs=epochs,
                    scheduler=scheduler,
                    seed=0,
                    metric="val_loss",
                    train=TRIAL,
                    progress=False,
                ),
                data=data,
            )
            frame = result.dataframe()
            got = figures[scheduler]
            got.setdefault("wall", []).append(time.perf_counter() - start)
            got.setdefault("epochs", []).append(float(frame["epochs"].sum()))
            got.setdefault("best", []).append(float(result.best_metrics["val_loss"]))
    for name, got in figures.items():
        print(
            f"{name:>5}: wall {spread(got['wall'])}  epochs {spread(got['epochs'], '')}  "
            f"best val_loss {spread(got['best'], '')}"
        )
    asha, fifo = figures["asha"], figures["fifo"]
    wall = statistics.median(asha["wall"]) / statistics.median(fifo["wall"])
    best = statistics.median(asha["best"]) / statistics.median(fifo["best"]) - 1
    print(
        f"ASHA / FIFO: wall {wall:.2f}x (goal <= 0.5), epochs "
        f"{statistics.median(asha['epochs']) / statistics.median(fifo['epochs']):.2f}x, "
        f"best val_loss {best:+.1%} (goal within 2%)"
    )


def raymodel_tune(data, epochs: int) -> float:
    start = time.perf_counter()
    DigitsNet(config={"hidden": 64}).tune(
        {"lr": rm.tune.grid_search(GRID)},
        data=data,
        settings=rm.TuneSettings(
            num_samples=1, max_epochs=epochs, scheduler="fifo", metric="val_loss", train=TRIAL, progress=False
        ),
    )
    return time.perf_counter() - start


def _refs(data):
    import ray

    tr, va = data.splits["train"], data.splits["valid"]
    return [ray.put(a) for a in (tr.x, tr.y, va.x, va.y)]


def _tuner(trainable, resources, epochs: int, name: str):
    from ray import tune

    from raymodel._internal.locations import runs_root

    return tune.Tuner(
        tune.with_resources(trainable, resources),
        param_space={"hidden": 64, "lr": tune.grid_search(GRID), "epochs": epochs},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", max_concurrent_trials=2, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=runs_root(), name=f"{name}-{time.time_ns()}", verbose=0),
    )


def hand_written_train_tune(data, epochs: int) -> float:
    """Each trial starts a Ray Train `TorchTrainer` (a worker group of one), as Ray's docs show."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    refs = _refs(data)

    def trial(config):
        trainer = TorchTrainer(
            hand_written_loop,
            train_loop_config={**config, "batch_size": 64, "refs": refs},
            scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.95}),
            run_config=RunConfig(
                storage_path=tune.get_context().get_trial_dir(), name="train", callbacks=[TuneReportCallback()]
            ),
        )
        trainer.fit()

    tuner = _tuner(trial, {"CPU": 0.01}, epochs, "hand-train")
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


def plain_loop(config, refs, report) -> None:
    """The digits MLP's training loop, as a user writes it in a plain Tune function trainable."""
    import ray

    torch.manual_seed(0)
    Xtr, ytr, Xva, yva = (ray.get(r) if not isinstance(r, np.ndarray) else r for r in refs)
    xt, yt = torch.tensor(Xtr, dtype=torch.float32), torch.tensor(ytr)
    xv, yv = torch.tensor(Xva, dtype=torch.float32), torch.tensor(yva)
    net = nn.Sequential(nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10))
    opt = torch.optim.Adam(net.parameters(), lr=config["lr"])
    for epoch in range(1, config["epochs"] + 1):
        order = torch.randperm(len(xt))
        total, n = 0.0, 0
        for start in range(0, len(order), 64):
            idx = order[start : start + 64]
            opt.zero_grad()
            loss = F.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total, n = total + loss.item(), n + 1
        with torch.no_grad():
            logits = net(xv)
            metrics = {
                "epoch": epoch,
                "loss": total / n,
                "val_loss": F.cross_entropy(logits, yv).item(),
                "val_acc": (logits.argmax(1) == yv).float().mean().item(),
            }
        report(metrics, net, opt)


def hand_written_plain_tune(data, epochs: int) -> float:
    """The training loop in the trial itself, a checkpoint each epoch: no Train at all."""
    from ray import tune

    refs = _refs(data)

    def report(metrics, net, opt):
        with tempfile.TemporaryDirectory() as tmp:
            torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, os.path.join(tmp, "model.pt"))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))

    tuner = _tuner(lambda config: plain_loop(config, refs, report), {"CPU": 0.95}, epochs, "hand-plain")
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


def pure_compute(data, epochs: int) -> float:
    tr, va = data.splits["train"], data.splits["valid"]
    arrays = [tr.x, tr.y, va.x, va.y]
    start = time.perf_counter()
    for lr in GRID:
        plain_loop({"hidden": 64, "lr": lr, "epochs": epochs}, arrays, lambda *a: None)
    return time.perf_counter() - start


def versus_hand_written(data, reps: int, epochs: int) -> None:
    print(
        f"-- 2. model.tune vs hand-written Ray: grid of {len(GRID)} lrs, FIFO, {epochs} epochs, "
        f"one worker a trial, 2 at once, {reps} repetitions --"
    )
    runs = {
        "model.tune": raymodel_tune,
        "Tuner + TorchTrainer": hand_written_train_tune,
        "plain Tune function": hand_written_plain_tune,
    }
    walls: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(reps):
        order = list(runs) if rep % 2 == 0 else list(reversed(runs))
        for name in order:
            walls[name].append(runs[name](data, epochs))
    compute = [pure_compute(data, epochs) for _ in range(reps)]
    for name, values in walls.items():
        print(f"{name:>22}: {spread(values)}")
    print(f"{'pure compute, no Ray':>22}: {spread(compute)}")
    ours = statistics.median(walls["model.tune"])
    print(
        f"model.tune / Tuner + TorchTrainer: {ours / statistics.median(walls['Tuner + TorchTrainer']):.2f}x "
        f"(goal <= 0.3)"
    )
    print(
        f"model.tune / plain Tune function:  {ours / statistics.median(walls['plain Tune function']):.2f}x "
        f"(goal <= 1.1)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    X, y = load_data()
    data = rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)
    rm.init(num_cpus=2)
    raymodel_tune(data, 1)  # warm-up: the first experiment of a Ray instance pays its imports
    asha_vs_fifo(data, args.reps, args.samples, args.epochs, "digits")
    # The same search where the epochs, not Tune's start-up, dominate: each epoch sees the rows 10 times.
    tr = data.splits["train"]
    heavy = rm.data.DataSpec(
        {"train": rm.data.Arrays(np.tile(tr.x, (10, 1)), np.tile(tr.y, 10)), "valid": data.splits["valid"]}
    )
    asha_vs_fifo(heavy, args.reps, args.samples, args.epochs, "digits x10 rows an epoch")
    versus_hand_written(data, args.reps, args.epochs)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
