"""Preemption: an urgent job arrives while a long one holds the whole cluster.

A low-priority digits job (2 workers, `--low-epochs` epochs of about `--pace` s each) runs on one
local Ray (2 CPUs). After `--after` epochs an urgent job (2 workers, `--high-epochs` epochs) arrives:

- **raymodel**: `priority=5`. The server preempts the running job at its epoch's end (a
  checkpoint is written), runs the urgent one on the same warm workers, then resumes the first
  one from its checkpoint.
- **hand-written Ray**: what a user does with Ray Train V2 and no scheduler: the training loop
  checks a stop flag (a small actor) after each epoch's checkpoint and returns; the urgent run is
  a new `TorchTrainer`; then the first run is started again under its name, and Ray Train resumes
  it from its newest checkpoint.

For each: seconds from the urgent job's arrival to its first epoch, epochs the long job ran twice,
and seconds from the arrival until both are done. Both use the same model, data, epochs, workers,
batch size, and checkpoint every epoch.

    python benchmarks/preemption.py [--reps 2] [--low-epochs 12] [--after 3] [--high-epochs 3] [--pace 0.3]
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

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from digits import DigitsNet, load_data

import raymodel as rm


class Paced(rm.Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def after_epoch(self, epoch, metrics):
        time.sleep(self.seconds)


class Board:
    """The hand-written side's stop flag and epoch log (an actor every worker reaches)."""

    def __init__(self) -> None:
        self.stop, self.log = False, []

    def set_stop(self, value: bool) -> None:
        self.stop = value

    def should_stop(self) -> bool:
        return self.stop

    def epoch(self, run: str, epoch: int) -> None:
        self.log.append((run, epoch, time.time()))

    def entries(self) -> list:
        return list(self.log)


def hand_written_loop(config):
    """A Ray Train V2 loop a user writes: DDP, a checkpoint every epoch, resume, a cooperative stop."""
    import ray
    import ray.train
    import ray.train.torch

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    start = 1
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "model.pt"))
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    net = ray.train.torch.prepare_model(net)
    X, y = ray.get(config["refs"])
    loader = ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.tensor(X, dtype=torch.float32), torch.tensor(y)),
            batch_size=64,
            shuffle=True,
        )
    )
    board, rank = config["board"], ray.train.get_context().get_world_rank()
    for epoch in range(start, config["epochs"] + 1):
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt.step()
        time.sleep(config["pace"])
        with tempfile.TemporaryDirectory() as tmp:
            saved = None
            if rank == 0:
                module = net.module if hasattr(net, "module") else net
                torch.save(
                    {"model": module.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, f"{tmp}/model.pt"
                )
                saved = ray.train.Checkpoint.from_directory(tmp)
                ray.get(board.epoch.remote(config["run"], epoch))
            ray.train.report({"epoch": epoch}, checkpoint=saved)
        if ray.get(board.should_stop.remote()) and epoch < config["epochs"]:
            return


def hand_written(data, args, storage: str) -> dict[str, float]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    board = ray.remote(num_cpus=0)(Board).remote()
    refs = [ray.put(data.splits["train"].x), ray.put(data.splits["train"].y)]
    tag = os.urandom(3).hex()

    def fit(run: str, epochs: int) -> None:
        config = {"refs": refs, "board": board, "run": run, "epochs": epochs, "pace": args.pace}
        TorchTrainer(
            hand_written_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name=f"{run}-{tag}", storage_path=storage),
        ).fit()

    low = threading.Thread(target=fit, args=("low", args.low_epochs))
    low.start()
    while sum(1 for r, *_ in ray.get(board.entries.remote()) if r == "low") < args.after:
        time.sleep(0.05)
    arrived = time.time()
    ray.get(board.set_stop.remote(True))  # the urgent job arrives: ask the long one to stop
    low.join()
    ray.get(board.set_stop.remote(False))
    fit("high", args.high_epochs)
    fit("low", args.low_epochs)  # the same name: Ray Train resumes it from its newest checkpoint
    done = time.time()
    log = ray.get(board.entries.remote())
    first_high = min(t for r, _, t in log if r == "high")
    low_epochs = [e for r, e, _ in log if r == "low"]
    return {
        "first": first_high - arrived,
        "twice": len(low_epochs) - len(set(low_epochs)),
        "both": done - arrived,
    }


def with_raymodel(data, args) -> dict[str, float]:
    common = {"num_workers": 2, "batch_size": 64, "progress": False, "callbacks": [Paced(args.pace)]}
    low = DigitsNet().train({**common, "num_epochs": args.low_epochs}, data=data, wait=False)
    while len(low.history()) < args.after:
        time.sleep(0.05)
    arrived = time.time()
    high = DigitsNet().train({**common, "num_epochs": args.high_epochs, "priority": 5}, data=data, wait=False)
    next(iter(high.stream()))
    first = time.time() - arrived
    high.wait()
    low.wait()
    done = time.time()
    epochs = [row["epoch"] for row in low.history()]
    return {"first": first, "twice": len(epochs) - len(set(epochs)), "both": done - arrived}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--low-epochs", type=int, default=12)
    parser.add_argument("--after", type=int, default=3)
    parser.add_argument("--high-epochs", type=int, default=3)
    parser.add_argument("--pace", type=float, default=0.3)
    args = parser.parse_args()
    X, y = load_data()
    data = rm.data.from_numpy(X.astype("float32"), y, valid_fraction=0.2)
    rm.init(num_cpus=2)
    DigitsNet().train({"num_workers": 2, "num_epochs": 1, "progress": False}, data=data)  # warm: the pool is up

    rows: dict[str, list[dict[str, float]]] = {"raymodel": [], "hand-written Ray": []}
    with tempfile.TemporaryDirectory() as storage:
        for rep in range(args.reps):
            rows["raymodel"].append(with_raymodel(data, args))
            rm.jobs.release_pools()  # the hand-written runs need the CPUs the pool holds
            rows["hand-written Ray"].append(hand_written(data, args, storage))
            print(f"rep {rep + 1}: raymodel {rows['raymodel'][-1]}  hand-written {rows['hand-written Ray'][-1]}")
    print()
    print(f"{'':18} {'urgent job first epoch (s)':>28} {'long job epochs run twice':>26} {'both done (s)':>14}")
    for name, results in rows.items():
        med = {k: statistics.median(r[k] for r in results) for k in ("first", "twice", "both")}
        span = {k: (min(r[k] for r in results), max(r[k] for r in results)) for k in ("first", "both")}
        print(
            f"{name:18} {med['first']:>18.2f} [{span['first'][0]:.2f}-{span['first'][1]:.2f}] "
            f"{med['twice']:>26.0f} {med['both']:>8.1f} [{span['both'][0]:.0f}-{span['both'][1]:.0f}]"
        )
    ours, theirs = (statistics.median(r["first"] for r in rows[k]) for k in rows)
    print(f"\nurgent job's first epoch: raymodel {ours / theirs:.2f}x the hand-written time (goal: <= 0.5x)")


if __name__ == "__main__":
    main()
