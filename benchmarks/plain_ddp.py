"""The floor under a warm job's epochs: the digits MLP trained by plain ``torch.distributed`` (DDP over gloo),
two processes, no Ray and no raymodel, on this machine.

The same model, rows and batch size as ``first_contact.py``'s warm job (2 workers, the 1,437 training rows
split between them, batch 64 a worker: 12 steps an epoch), one intra-op thread a process (as in Ray's
workers). Each epoch ends with a barrier, so its time is the slower rank's. Prints the median epoch.

This is not raymodel measured against anything: it says how fast such an epoch can be here, to read a
warm job's timeline against (docs/performance.md).

    python benchmarks/plain_ddp.py [--epochs 30]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn


def rank_main(rank: int, world: int, port: int, epochs: int, out: dict[int, list[float]]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    X, y = load_digits(return_X_y=True)
    x_all, y_all = torch.tensor(X / 16.0, dtype=torch.float32)[:1437], torch.tensor(y)[:1437]
    x, labels = x_all[rank::world], y_all[rank::world]
    net = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        order = torch.randperm(len(x))
        for i in range(0, len(x), 64):
            rows = order[i : i + 64]
            loss = F.cross_entropy(net(x[rows]), labels[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    out[rank] = times
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(rank_main, args=(2, port, args.epochs, out), nprocs=2)
        times = out[0][5:]  # the first epochs warm the allocator and gloo's buffers
    print(
        f"plain DDP (gloo, 2 processes, 1 thread each), digits MLP, 12 steps of 64 rows a rank: "
        f"epoch p50 {statistics.median(times) * 1000:.1f} ms (min {min(times) * 1000:.1f}, "
        f"max {max(times) * 1000:.1f}; {len(times)} epochs after 5 to warm up)"
    )


if __name__ == "__main__":
    main()
