"""`model.serve` vs a hand-written Ray Serve deployment of the same model.

Same model and weights, same JSON in and out, same closed-loop load: 16
keep-alive clients, each sending its next request when the last one is
answered, from our own asyncio client and then from `wrk` (Debian's package,
an outside load generator: `benchmarks/loadgen.py`). Prints requests/s, p50
and p99 latency and the ratio, for
1. the digits MLP, and 2. a compute-heavy MLP, where raymodel's adaptive
batching should give >= 2x the throughput of the raw per-request deployment.

    python benchmarks/serve_throughput.py [--seconds 10] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402
import raymodel as rm  # noqa: E402
from digits import DigitsNet, load_data  # noqa: E402


class HeavyNet(DigitsNet):
    """The digits MLP with six 4096-wide hidden layers (400 MB of weights): forward dominates
    the request cost, and one forward over a batch reads the weights once for all its rows."""

    default_config = {"hidden": 4096, "layers": 6, "lr": 1e-3}

    def setup(self, config):
        h = config["hidden"]
        layers: list[nn.Module] = [nn.Linear(64, h), nn.ReLU()]
        for _ in range(config["layers"] - 1):
            layers += [nn.Linear(h, h), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(h, 10))


class RawDeployment:
    """What a user writes by hand: one request, one forward, no batching."""

    def __init__(self, checkpoint: str) -> None:
        self.model = rm.RayModel.from_checkpoint(checkpoint)
        for m in self.model.backend.modules(self.model).values():
            m.eval()

    async def __call__(self, request):
        payload = await request.json()
        x = torch.tensor(payload["pixels"], dtype=torch.float32)
        with torch.inference_mode():
            out = self.model.net(x)
        return {"digit": out.argmax(-1).tolist()}


async def load(url: str, body: dict, clients: int, seconds: float) -> tuple[float, float, float]:
    import aiohttp

    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client(session) -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.post(url, json=body) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(clients):  # warm up every connection
            async with session.post(url, json=body) as r:
                await r.read()
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return len(latencies) / elapsed, statistics.median(latencies), latencies[int(0.99 * (len(latencies) - 1))]


def compare(title: str, model: rm.RayModel, body: dict, args, wait_s: float) -> None:
    from ray import serve

    model.ensure_setup()
    torch.manual_seed(0)
    ours = model.serve("/bench-ours", settings={"max_batch_size": 16, "batch_wait_timeout_s": wait_s,
                                                "ray_actor_options": {"num_cpus": 0.5}})
    import requests

    checkpoint = requests.get(ours.url + "/info", timeout=30).json()["source"]["checkpoint"]
    serve.run(serve.deployment(RawDeployment).options(name="raw", max_ongoing_requests=64,
                                                      ray_actor_options={"num_cpus": 0.5}).bind(checkpoint),
              name="raw", route_prefix="/bench-raw")
    host = ours.url.rsplit("/", 1)[0]
    ours_stats = asyncio.run(load(ours.url, body, args.clients, args.seconds))
    raw_stats = asyncio.run(load(f"{host}/bench-raw", body, args.clients, args.seconds))
    print(f"-- {title}: {args.clients} keep-alive clients, {args.seconds:.0f}s each --")
    print("our asyncio client (aiohttp):")
    for name, (rps, p50, p99) in (("raymodel", ours_stats), ("hand-written", raw_stats)):
        print(f"{name:>14}: {rps:8.1f} req/s  p50 {p50 * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms")
    print(f"throughput ratio raymodel / hand-written: {ours_stats[0] / raw_stats[0]:.2f}")
    if loadgen.available():
        print(f"wrk (outside load generator, {args.threads} threads, {args.clients} connections):")
        figures = {name: loadgen.wrk(url, body, connections=args.clients, threads=args.threads, seconds=args.seconds)
                   for name, url in (("raymodel", ours.url), ("hand-written", f"{host}/bench-raw"))}
        for name, f in figures.items():
            print(f"{name:>14}: {f['rps']:8.1f} req/s  p50 {f['p50_ms']:7.1f} ms  p99 {f['p99_ms']:7.1f} ms  "
                  f"non-2xx {f['non_2xx']}  socket errors {f['socket_errors']}")
        ratio = figures["raymodel"]["rps"] / figures["hand-written"]["rps"]
        print(f"throughput ratio raymodel / hand-written (wrk): {ratio:.2f}")
    else:
        print("wrk is not installed (apt-get install wrk; `make tools`): no outside load generator figures")

    info = requests.get(ours.url + "/info", timeout=30).json()
    print(f"raymodel batch sizes seen: {info['batch_sizes_seen']}, mean {info['mean_batch_size']:.1f}")
    ours.shutdown()
    serve.delete("raw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    args = parser.parse_args()
    X, _ = load_data()
    body = {"pixels": X[:1].astype(np.float32).tolist()}
    rm.init(num_cpus=2)
    compare("digits MLP", DigitsNet(), body, args, wait_s=0.002)
    compare("compute-heavy MLP (6 x 4096 hidden)", HeavyNet(), body, args, wait_s=0.03)


if __name__ == "__main__":
    main()
