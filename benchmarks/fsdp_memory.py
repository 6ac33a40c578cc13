"""FSDP against DDP: each worker's peak memory and step time, raymodel and hand-written Ray Train.

A ~50M-parameter MLP (`--blocks` blocks of `--width` x `--width` Linear + ReLU), 2 workers (gloo,
one CPU each), `--steps` Adam steps of `--batch` rows of random data per worker (an autoencoder's
MSE). With two GPUs or more, each worker has one (NCCL) and its peak is CUDA's allocated memory.
Six runs, each a fresh Ray Train run (fresh worker processes, so peak RSS is this run's):

- **hand-written**: a `TorchTrainer` loop: DDP by `ray.train.torch.prepare_model`, or FSDP2 by
  `fully_shard` on each block and then the model, on a mesh of the two workers;
- **raymodel**: the same model as a `RayTorchModel`, `model.train(strategy="ddp" | "fsdp")`,
  `pool=False` (a one-off run: fresh processes), each epoch checkpointed as usual.

FSDP runs twice: `reshard_after_forward=True` (PyTorch's default: a block's weights are gathered
for its forward, freed, gathered again for its backward) and `False` (kept from forward to
backward: one all-gather fewer, more memory). Per run: the parameters each worker holds, each
worker's peak RSS above its RSS before the model was built (the model's construction included),
and the median step time (the first step left out).

The workers run with `MALLOC_TRIM_THRESHOLD_=0` (glibc gives freed memory back to the system at
once): glibc keeps what FSDP frees after each gather, and peak RSS then says little of what a
strategy needs. `--default-malloc` leaves glibc as it is.

    python benchmarks/fsdp_memory.py [--steps 6] [--batch 256] [--width 2048] [--blocks 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import raymodel as rm


def _rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _peak_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak() -> float:
    """The peak starts again from now; returns the memory in use now. On a GPU: CUDA's allocator;
    else this process's RSS (Linux: `clear_refs` 5 resets its peak)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _rss_mib()


def _peak() -> float:
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else _peak_mib()


def _held(parameters) -> tuple[int, int]:
    from torch.distributed.tensor import DTensor

    params = list(parameters)
    held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
    return held, sum(p.numel() for p in params)


def _mlp(width: int, blocks: int) -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)])


# ------------------------------------------------------------------ hand-written
def hand_loop(config):
    import ray.train
    import ray.train.torch

    device = ray.train.torch.get_device()
    start = _reset_peak()
    torch.manual_seed(0)
    model = _mlp(config["width"], config["blocks"]).to(device)
    if config["strategy"] == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (ray.train.get_context().get_world_size(),))
        for block in model:
            fully_shard(block, mesh=mesh, reshard_after_forward=config["reshard"])
        fully_shard(model, mesh=mesh)
    else:
        model = ray.train.torch.prepare_model(model)
    held, total = _held(model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    times = []
    for _ in range(config["steps"]):
        x = torch.randn(config["batch"], config["width"], device=device)
        began = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(model(x), x).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    row = {"held": held, "total": total, "peak_mib": _peak() - start, "step_s": statistics.median(times[1:])}
    rank = ray.train.get_context().get_world_rank()
    Path(config["out"], f"{rank}.json").write_text(json.dumps(row))


def hand_written(strategy: str, reshard: bool, args, out: str) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    config = {"strategy": strategy, "reshard": reshard, "out": out, **_sizes(args)}
    TorchTrainer(
        hand_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=args.gpu),
        run_config=RunConfig(storage_path=out, name="hand"),
    ).fit()


# ------------------------------------------------------------------ raymodel
class BigMLP(rm.RayTorchModel):
    def setup(self, config):
        torch.manual_seed(0)
        self.net = _mlp(config["width"], config["blocks"])

    def shard_modules(self):
        return list(self.net)

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=1e-4)

    def forward(self, x):
        return self.net(x)

    def train_step(self, batch):
        (x,) = batch
        return F.mse_loss(self(x), x)


class Memory(rm.Callback):
    """Each worker's peak RSS above its RSS before ``setup`` built the model, its share of the
    parameters, and its median step time, into ``<out>/<rank>.json``."""

    def __init__(self, out: str) -> None:
        self.out, self.start, self.began, self.times = out, 0.0, 0.0, []

    def before_setup(self):
        self.start = _reset_peak()

    def before_batch(self, batch, batch_idx):
        self.began = time.perf_counter()

    def after_batch(self, batch_idx, outputs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.began)  # the optimizer has stepped

    def after_epoch(self, epoch, metrics):
        held, total = _held(self.model.net.parameters())
        row = {"held": held, "total": total, "peak_mib": _peak() - self.start}
        row["step_s"] = statistics.median(self.times[1:])
        Path(self.out, f"{self.context.rank}.json").write_text(json.dumps(row))


def with_raymodel(strategy: str, reshard: bool, args, out: str) -> None:
    rows = 2 * args.steps * args.batch
    x = np.random.default_rng(0).standard_normal((rows, args.width)).astype(np.float32)
    settings = {
        "num_workers": 2,
        "num_epochs": 1,
        "batch_size": args.batch,
        "shuffle": False,
        "strategy": strategy,
        "reshard_after_forward": reshard,
        "pool": False,
        "use_gpu": args.gpu,
        "storage_path": out,
        "progress": False,
        "callbacks": [Memory(out)],
    }
    BigMLP(config=_sizes(args)).train(settings, data=rm.data.from_numpy(x))


def _sizes(args) -> dict:
    return {"width": args.width, "blocks": args.blocks, "steps": args.steps, "batch": args.batch}


def measure(run, strategy: str, reshard: bool, args) -> dict:
    with tempfile.TemporaryDirectory() as out:
        run(strategy, reshard, args, out)
        ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in (0, 1)]
    return {
        "held": [r["held"] for r in ranks],
        "total": ranks[0]["total"],
        "peak_mib": max(r["peak_mib"] for r in ranks),
        "step_s": statistics.median(r["step_s"] for r in ranks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--default-malloc", action="store_true", help="leave glibc's allocator as it is")
    args = parser.parse_args()
    args.gpu = torch.cuda.device_count() >= 2  # one GPU per worker: CUDA's peak instead of RSS
    env = {} if args.default_malloc else {"MALLOC_TRIM_THRESHOLD_": "0"}
    os.environ.update(env)  # this process too: the raymodel runs' workers are started by Ray from it
    rm.init(num_cpus=2, runtime_env={"env_vars": env})
    ways = [("ddp", True), ("fsdp", True), ("fsdp", False)]
    results = {}
    for side, run in (("hand-written", hand_written), ("raymodel", with_raymodel)):
        for strategy, reshard in ways:
            results[side, strategy, reshard] = measure(run, strategy, reshard, args)
    total = results["raymodel", "ddp", True]["total"]
    memory = "CUDA peak allocated" if args.gpu else f"peak RSS (glibc trim: {bool(env)})"
    print(f"\n{total / 1e6:.1f}M parameters, 2 workers, batch {args.batch}, Adam; {memory}")
    print(f"{'':13} {'strategy':32} {'held per worker':>18} {'peak MiB':>9} {'step s':>7} {'vs DDP':>16}")
    for (side, strategy, reshard), r in results.items():
        name = strategy if strategy == "ddp" else f"fsdp (reshard_after_forward={reshard})"
        held = f"{max(r['held']) / 1e6:.1f}M ({max(r['held']) / r['total']:.2f})"
        ddp = results[side, "ddp", True]
        versus = f"{r['peak_mib'] / ddp['peak_mib']:.2f}x, {r['step_s'] / ddp['step_s']:.2f}x"
        print(f"{side:13} {name:32} {held:>18} {r['peak_mib']:9.0f} {r['step_s']:7.3f} {versus:>16}")
    print("goals: FSDP peak memory <= 0.6x DDP's, FSDP step time <= 1.5x DDP's (vs DDP: memory, step)")
    for strategy, reshard in ways:
        mine, hand = results["raymodel", strategy, reshard], results["hand-written", strategy, reshard]
        print(
            f"raymodel / hand-written, {strategy} {reshard if strategy == 'fsdp' else ''}: peak memory "
            f"{mine['peak_mib'] / hand['peak_mib']:.2f}x, step time {mine['step_s'] / hand['step_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
