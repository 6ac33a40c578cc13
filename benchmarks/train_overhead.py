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
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from digits import DigitsNet

import raymodel as rm


def hand_written_loop(config):
    """What a user writes by hand with Ray Train V2 and plain PyTorch."""
    import ray.train
    import ray.train.torch

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10))
    net = ray.train.torch.prepare_model(net)
    opt = torch.optim.Adam(net.parameters(), lr=config["lr"])
    Xtr, ytr, Xva, yva = (ray.get(r) for r in config["refs"])
    train = torch.utils.data.TensorDataset(torch.tensor(Xtr, dtype=torch.float32), torch.tensor(ytr))
    valid = torch.utils.data.TensorDataset(torch.tensor(Xva, dtype=torch.float32), torch.tensor(yva))
    train_loader = ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(train, batch_size=config["batch_size"], shuffle=True)
    )
    valid_loader = ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(valid, batch_size=config["batch_size"])
    )
    world = ray.train.get_context().get_world_size()
    for epoch in range(1, config["epochs"] + 1):
        if world > 1:
            train_loader.sampler.set_epoch(epoch)
        net.train()
        total, n = 0.0, 0
        for x, y in train_loader:
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            total, n = total + loss.item(), n + 1
        net.eval()
        correct, count, vloss = 0.0, 0, 0.0
        with torch.no_grad():
            for x, y in valid_loader:
                logits = net(x)
                vloss += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(1) == y).sum().item()
                count += len(y)
        stats = torch.tensor([total, n, vloss, correct, count], dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(stats)
        metrics = {
            "epoch": epoch,
            "loss": stats[0].item() / stats[1].item(),
            "val_loss": stats[2].item() / stats[4].item(),
            "val_acc": stats[3].item() / stats[4].item(),
        }
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                module = net.module if hasattr(net, "module") else net
                torch.save({"model": module.state_dict(), "optimizer": opt.state_dict()}, os.path.join(tmp, "model.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=checkpoint)


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
