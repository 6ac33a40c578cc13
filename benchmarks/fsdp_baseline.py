"""Before FSDP in raymodel (issue 29): what hand-written Ray Train DDP and FSDP2 cost on this machine.

A ~50M-parameter MLP (12 blocks of 2048x2048), 2 Ray Train workers (gloo), a few Adam steps on
random data; for each strategy: the parameters each rank holds, each worker's peak RSS above what
it held before the model was built, and the median step time. This is the design input for
``TrainSettings(strategy="fsdp")``; ``benchmarks/fsdp_memory.py`` (with raymodel) follows it.

    python benchmarks/fsdp_baseline.py [--steps 6] [--width 2048] [--blocks 12] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time


def loop(config):
    import psutil
    import ray.train
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    before = psutil.Process().memory_info().rss
    width, blocks = config["width"], config["blocks"]
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)])
    if config["strategy"] == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (ray.train.get_context().get_world_size(),))
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        held = sum(p.to_local().numel() for p in model.parameters())
    else:
        model = ray.train.torch.prepare_model(model)
        held = sum(p.numel() for p in model.parameters())
    total = sum(p.numel() for p in (model.module if hasattr(model, "module") else model).parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    times = []
    for _ in range(config["steps"]):
        x = torch.randn(config["batch"], width)
        start = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(model(x), x).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    row = {"held": held, "total": total, "peak_mib": (peak - before) / 2**20, "step_s": statistics.median(times[1:])}
    rank = ray.train.get_context().get_world_rank()
    with open(f"{config['out']}/rank{rank}.json", "w") as f:  # the driver reads every rank's figures
        json.dump(row, f)


def run(strategy: str, args) -> dict:
    import tempfile

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    config = {
        "strategy": strategy,
        "width": args.width,
        "blocks": args.blocks,
        "steps": args.steps,
        "batch": args.batch,
    }
    with tempfile.TemporaryDirectory() as storage:
        config["out"] = storage
        TorchTrainer(
            loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=storage),
        ).fit()
        rows = [json.load(open(f"{storage}/rank{r}.json")) for r in range(2)]
    return {
        "held": [r["held"] for r in rows],
        "total": rows[0]["total"],
        "peak_mib": [round(r["peak_mib"]) for r in rows],
        "step_s": statistics.median(r["step_s"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2)
    out = {s: run(s, args) for s in ("ddp", "fsdp")}
    for name, r in out.items():
        share = max(r["held"]) / r["total"]
        print(
            f"{name:5} params {r['total'] / 1e6:.1f}M, per rank {[f'{h / 1e6:.1f}M' for h in r['held']]} "
            f"({share:.2f} of the whole); peak RSS above start {r['peak_mib']} MiB; step {r['step_s']:.3f} s"
        )
    ddp, fsdp = out["ddp"], out["fsdp"]
    print(
        f"fsdp/ddp: peak memory {max(fsdp['peak_mib']) / max(ddp['peak_mib']):.2f}x, "
        f"step time {fsdp['step_s'] / ddp['step_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
