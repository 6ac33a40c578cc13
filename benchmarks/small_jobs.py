"""Small jobs: one-off Ray Train runs vs jobs on a warm pool vs the same loop in one process.

The digits MLP (examples/digits.py), 2 workers, 3 epochs, batch 64, on one local Ray (2 CPUs):

- **one process**: the same PyTorch loop (train, validate, every epoch) in this process, no Ray;
- **one-off**: `model.train({..., "pool": False})`, a Ray Train run of its own per job (round 2);
- **hand-written**: the outside side: a hand-written `TorchTrainer` run per job (the loop of
  `train_overhead.py`: the same model, data, epochs and checkpoint each epoch), what a user of Ray
  Train without raymodel pays for each small job;
- **pool, job**: `model.train(..., wait=False)` then `job.wait()` on a warm pool: wall time from
  submission to the result, and to the first row of `job.stream()`;
- **pool, blocking**: `model.train(...)` on the warm pool (the call a notebook makes);
- **tune**: 8 trials of 2 workers each (FIFO, 3 epochs each), `pool=False` vs through pools.

Each repetition runs `--jobs` jobs back to back per mode (`--one-off-jobs` for the one-off runs,
which cost a worker-group start each); the table gives per-job p50 and p95, and the medians over
repetitions with their ranges.

    python benchmarks/small_jobs.py [--reps 3] [--jobs 20] [--one-off-jobs 5] [--tune-reps 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsNet, load_data

import raymodel as rm

SETTINGS = {"num_workers": 2, "num_epochs": 3, "batch_size": 64, "progress": False}
GOALS = (
    "goals: pool job p50 <= 1.0 s (<= 0.55 s with the durable server), first row <= 0.5 s; blocking <= 1.5x "
    "the job; tune through pools <= 0.3x"
)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def one_process(data) -> float:
    """The same model and loop in this process: what the epochs themselves cost."""
    start = time.perf_counter()
    model = DigitsNet()
    model.setup(model.config)
    optimizer = model.configure_optimizers()
    tr, va = data.splits["train"], data.splits["valid"]
    x, y = torch.tensor(tr.x), torch.tensor(tr.y)
    xv, yv = torch.tensor(va.x), torch.tensor(va.y)
    for epoch in range(SETTINGS["num_epochs"]):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(x), SETTINGS["batch_size"]):
            idx = order[i : i + SETTINGS["batch_size"]]
            optimizer.zero_grad()
            F.cross_entropy(model.forward(x[idx]), y[idx]).backward()
            optimizer.step()
        with torch.no_grad():
            logits = model.forward(xv)
            _ = (F.cross_entropy(logits, yv).item(), (logits.argmax(1) == yv).float().mean().item())
    return time.perf_counter() - start


def hand_written(data) -> float:
    """A hand-written ``TorchTrainer`` run: the outside side (``train_overhead.py``'s loop)."""
    from train_overhead import run_hand_written

    return run_hand_written(data, rm.TrainSettings(**SETTINGS))


def one_off(data) -> float:
    start = time.perf_counter()
    DigitsNet().train({**SETTINGS, "pool": False}, data=data)
    return time.perf_counter() - start


def pool_job(data) -> tuple[float, float]:
    """(to the first row, to the result) of one job on the warm pool."""
    start = time.perf_counter()
    job = DigitsNet().train(SETTINGS, data=data, wait=False)
    first = None
    for _ in job.stream():
        first = first or time.perf_counter() - start
    job.wait()
    return first, time.perf_counter() - start


def pool_blocking(data) -> float:
    start = time.perf_counter()
    DigitsNet().train(SETTINGS, data=data)
    return time.perf_counter() - start


def tune(data, pool: bool) -> float:
    settings = {
        "num_samples": 8,
        "max_epochs": SETTINGS["num_epochs"],
        "scheduler": "fifo",
        "progress": False,
        "train": {**SETTINGS, "resources_per_worker": {"CPU": 0.95}, "pool": pool},
    }
    start = time.perf_counter()
    DigitsNet().tune({"lr": rm.tune.loguniform(1e-3, 1e-2)}, settings=settings, data=data)
    return time.perf_counter() - start


def summary(name: str, reps: list[list[float]]) -> tuple[float, str]:
    """``name  p50 (range)  p95 (range)`` over repetitions; returns the median p50 and the line."""
    p50s = [percentile(r, 50) for r in reps]
    p95s = [percentile(r, 95) for r in reps]
    mid = statistics.median(p50s)
    line = (
        f"{name:<22} {mid:>8.2f} ({min(p50s):.2f}-{max(p50s):.2f})"
        f"   {statistics.median(p95s):>8.2f} ({min(p95s):.2f}-{max(p95s):.2f})   n={sum(map(len, reps))}"
    )
    return mid, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--one-off-jobs", type=int, default=5)
    parser.add_argument("--tune-reps", type=int, default=2)
    args = parser.parse_args()

    X, y = load_data()
    data = rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)
    rm.init(num_cpus=2)
    start = time.perf_counter()
    pool_blocking(data)  # the pool's start: paid once
    print(f"first job, starting the pool: {time.perf_counter() - start:.1f} s")

    keys = ("process", "hand-written", "one-off", "first row", "job", "blocking")
    rows: dict[str, list[list[float]]] = {k: [] for k in keys}
    for rep in range(args.reps):
        rows["process"].append([one_process(data) for _ in range(args.jobs)])
        firsts, jobs = zip(*(pool_job(data) for _ in range(args.jobs)))
        rows["first row"].append(list(firsts))
        rows["job"].append(list(jobs))
        rows["blocking"].append([pool_blocking(data) for _ in range(args.jobs)])
        rows["one-off"].append([one_off(data) for _ in range(args.one_off_jobs)])  # releases the idle pool
        rows["hand-written"].append([hand_written(data) for _ in range(args.one_off_jobs)])
        pool_blocking(data)  # the pool back, warm, for the next repetition
        print(f"repetition {rep + 1}/{args.reps} done", flush=True)

    print(f"\nper job, seconds: median of {args.reps} repetitions (range)")
    print(f"{'':<22} {'p50':>8}              {'p95':>8}")
    figures = {}
    for key, label in (
        ("process", "one process (no Ray)"),
        ("hand-written", "hand-written TorchTrainer"),
        ("one-off", "one-off run (pool=False)"),
        ("job", "pool: job"),
        ("first row", "pool: first row"),
        ("blocking", "pool: blocking train"),
    ):
        figures[key], line = summary(label, rows[key])
        print(line)
    print(
        f"\npool job vs a hand-written TorchTrainer run: {figures['job'] / figures['hand-written']:.3f}x; "
        f"(internal) pool job vs one-off: {figures['job'] / figures['one-off']:.3f}x; "
        f"blocking vs job: {figures['blocking'] / figures['job']:.2f}x; "
        f"pool job vs one process: {figures['job'] / figures['process']:.1f}x"
    )

    today, pooled = [], []
    for rep in range(args.tune_reps):
        today.append(tune(data, pool=False))
        pooled.append(tune(data, pool=True))
        print(f"tune repetition {rep + 1}: pool=False {today[-1]:.1f} s, pools {pooled[-1]:.1f} s", flush=True)
    if today:  # `--tune-reps 0` measures the jobs alone
        ratio = statistics.median(pooled) / statistics.median(today)
        print(
            f"8 two-worker trials: today {statistics.median(today):.1f} s ({min(today):.1f}-{max(today):.1f}), "
            f"through pools {statistics.median(pooled):.1f} s ({min(pooled):.1f}-{max(pooled):.1f}): {ratio:.2f}x"
        )
    print(GOALS)


if __name__ == "__main__":
    main()
