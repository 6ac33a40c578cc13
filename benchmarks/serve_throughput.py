"""`model.serve` vs a hand-written Ray Serve deployment vs one plain uvicorn process, same model.

Same weights, same JSON in and out, same closed-loop load from `wrk` (Debian's
package, an outside load generator: `benchmarks/loadgen.py`; `make tools`
installs it): 16 keep-alive connections, each sending its next request when the
last one is answered. Prints requests/s, p50 and p99 latency and the ratios for
1. the digits MLP (goal: raymodel >= 0.5x the plain process's req/s, p99 <= 3x),
2. a compute-heavy MLP (goal: raymodel >= 2.5x the unbatched hand-written deployment).
The hand-written deployment runs on the same Serve, so behind the same ingress.

    python benchmarks/serve_throughput.py [--seconds 8] [--rounds 3] [--clients 16] [--ingress haproxy|proxy]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np
import requests
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen
from digits import DigitsNet, load_data

import raymodel as rm


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


def plain_process(checkpoint: str, port: int) -> subprocess.Popen:
    """benchmarks/plain_server.py: the model in one uvicorn + Starlette process, no Ray."""
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("plain_server.py")), checkpoint, "--port", str(port)]
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{port}/", timeout=1)
            return process
        except requests.ConnectionError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError("the plain uvicorn process did not start")


def compare(title: str, model: rm.RayModel, body: dict, args, wait_s: float, cpus: float) -> dict[str, dict]:
    from ray import serve

    model.ensure_setup()
    # As a trained model's checkpoint records it: raymodel checks each request's rows against it.
    model.input_signature = {"shape": [len(body["pixels"][0])], "dtype": "float32", "nonfinite": "warn"}
    torch.manual_seed(0)
    ours = model.serve(
        "/bench-ours",
        settings={"max_batch_size": 16, "batch_wait_timeout_s": wait_s, "ray_actor_options": {"num_cpus": cpus}},
    )
    info = requests.get(ours.url + "/info", timeout=30).json()
    checkpoint = info["source"]["checkpoint"]
    serve.run(
        serve.deployment(RawDeployment)
        .options(name="raw", max_ongoing_requests=64, ray_actor_options={"num_cpus": cpus})
        .bind(checkpoint),
        name="raw",
        route_prefix="/bench-raw",
    )
    host = ours.url.rsplit("/", 1)[0]
    plain = plain_process(checkpoint, args.plain_port)
    sides = {
        "raymodel": ours.url,
        "hand-written": f"{host}/bench-raw",
        "plain uvicorn": f"http://127.0.0.1:{args.plain_port}/",
    }
    try:
        for url in sides.values():  # warm up each side
            loadgen.wrk(url, body, connections=args.clients, threads=args.threads, seconds=2)
        runs = measure(sides, body, args)
    finally:
        plain.terminate()
        plain.wait()
    print(
        f"-- {title}: wrk, {args.threads} threads, {args.clients} connections, {args.rounds} rounds of "
        f"{args.seconds:.0f} s per side, sides taking turns; medians (min-max); Serve ingress: {info['ingress']} --"
    )
    figures = {}
    for name, rs in runs.items():
        rps = [r["rps"] for r in rs]
        figures[name] = f = {
            "rps": median(rps),
            "p50_ms": median([r["p50_ms"] for r in rs]),
            "p99_ms": median([r["p99_ms"] for r in rs]),
        }
        errors = sum(r["non_2xx"] + r["socket_errors"] for r in rs)
        print(
            f"{name:>14}: {f['rps']:8.1f} req/s ({min(rps):.0f}-{max(rps):.0f})  p50 {f['p50_ms']:6.1f} ms  "
            f"p99 {f['p99_ms']:6.1f} ms  errors {errors}  CPU per request: {cpu_per_request(rs)}"
        )
    for other in ("hand-written", "plain uvicorn"):
        ratio, p99 = paired(runs["raymodel"], runs[other])
        print(f"raymodel / {other + ':':<14} {ratio:.2f}x req/s, p99 {p99:.2f}x (median of the rounds' ratios)")
        figures["raymodel"][f"vs {other}"] = (ratio, p99)
    info = requests.get(ours.url + "/info", timeout=30).json()
    print(f"raymodel batch sizes seen: {info['batch_sizes_seen']}, mean {info['mean_batch_size']:.1f}")
    ours.shutdown()
    serve.delete("raw")
    return figures


def measure(sides: dict[str, str], body: dict, args) -> dict[str, list[dict]]:
    """``args.rounds`` rounds in which each side takes its turn: a slow spell of a shared machine
    lands on all sides alike, and the medians (and each round's ratios) leave it out."""
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, url in sides.items():
            before = loadgen.cpu_seconds()
            figures = loadgen.wrk(url, body, connections=args.clients, threads=args.threads, seconds=args.seconds)
            figures["cpu"] = loadgen.cpu_used(before, loadgen.cpu_seconds())
            runs[name].append(figures)
    return runs


def cpu_per_request(runs: list[dict]) -> str:
    """Microseconds of CPU per answered request, all processes but wrk, and the three busiest."""
    used: dict[str, float] = {}
    for r in runs:
        for name, seconds in r["cpu"].items():
            used[name] = used.get(name, 0.0) + seconds
    n = sum(r["requests"] for r in runs)
    top = sorted((kv for kv in used.items() if kv[1] > 0), key=lambda kv: -kv[1])[:3]
    return f"{1e6 * sum(used.values()) / n:.0f} us (" + ", ".join(f"{k} {1e6 * v / n:.0f}" for k, v in top) + ")"


def paired(ours: list[dict], other: list[dict]) -> tuple[float, float]:
    """Median over the rounds of raymodel / other, for req/s and for p99."""
    return (
        median([a["rps"] / b["rps"] for a, b in zip(ours, other)]),
        median([a["p99_ms"] / b["p99_ms"] for a, b in zip(ours, other)]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8, help="per side and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument(
        "--ingress", choices=("haproxy", "proxy"), default=None, help="Serve's ingress (default: raymodel's, haproxy)"
    )
    parser.add_argument("--plain-port", type=int, default=8100)
    args = parser.parse_args()
    if loadgen.available() is None:
        sys.exit("wrk is not installed: apt-get install wrk (`make tools` does it)")
    X, _ = load_data()
    body = {"pixels": X[:1].astype(np.float32).tolist()}
    rm.init(num_cpus=2, serve_ingress=args.ingress)
    tiny = compare("digits MLP", DigitsNet(), body, args, wait_s=0.002, cpus=1)
    heavy = compare("compute-heavy MLP (6 x 4096 hidden)", HeavyNet(), body, args, wait_s=0.03, cpus=1)
    ratio, p99 = tiny["raymodel"]["vs plain uvicorn"]
    heavy_ratio = heavy["raymodel"]["vs hand-written"][0]
    print("goals:")
    print(
        f"  digits MLP, raymodel / plain uvicorn req/s {ratio:.2f}x (goal >= 0.5x): {_verdict(ratio >= 0.5)}; "
        f"p99 {p99:.2f}x (goal <= 3x): {_verdict(p99 <= 3)}"
    )
    print(
        f"  heavy MLP, raymodel / unbatched hand-written req/s {heavy_ratio:.2f}x (goal >= 2.5x): "
        f"{_verdict(heavy_ratio >= 2.5)}"
    )


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


if __name__ == "__main__":
    main()
