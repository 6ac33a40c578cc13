"""The model server's routes vs the same routes written by hand on Ray Serve, and what a shadow costs.

Two registry versions of the digits MLP. Each side is a route on the same Serve (raymodel's default
ingress), loaded by `wrk` (`benchmarks/loadgen.py`) in turns, `--rounds` times:
- raymodel one version: `rm.Servable("digits@production", ...)`, the one-deployment route;
- raymodel split: `rm.Servable({"digits@production": 0.9, "digits@candidate": 0.1}, ...)`, the same
  one deployment, which picks the version in process (goal: >= 0.8x the one-version route's req/s,
  saturated);
- raymodel shadow: `rm.Servable("digits@production", ..., shadow="digits@candidate")`;
- hand-written split and shadow: an ingress deployment that picks one of two model deployments by
  weight through Serve handles (and for the shadow, sends a copy to the other without awaiting it);
  the model deployments take as many requests at once as raymodel's replicas (`max_ongoing_requests`
  64, not Serve's default 5) and batch them with `@serve.batch` at raymodel's sizes.
A paced client (`--rate` requests/s, one at a time, on a schedule: the latency a client sees on a
route that is not saturated); then `wrk` at a light load (`--light` connections) and at a closed-loop
load that saturates the 2 cores (`--clients`). Prints req/s, p50, p99 and
the ratios: raymodel split / hand-written split, and shadow / no shadow (the shadow's cost).

    python benchmarks/model_server.py [--seconds 6] [--rounds 2] [--clients 16] [--light 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import numpy as np
import requests
import torch
from ray import serve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen
from digits import DigitsNet, load_data

import raymodel as rm

SMALL = {"num_cpus": 0.25}
#: Both sides' batching and concurrency: raymodel's routes and the hand-written model deployments alike.
BATCH = {"max_batch_size": 16, "batch_wait_timeout_s": 0.0}
MAX_ONGOING = 64  # ServeSettings' default; Serve's own is 5


class HandModel:
    """One version, as a user who writes it well does: load from the registry, and batch the requests
    that arrive together with Serve's own ``@serve.batch`` (the sizes raymodel's routes get), one
    forward per batch."""

    def __init__(self, ref: str, registry: str) -> None:
        key, version = ref.split("@")
        self.model = rm.registry.open(registry).get(key, version)

    async def __call__(self, payload: dict) -> dict:
        return await self.batched(payload)

    @serve.batch(max_batch_size=BATCH["max_batch_size"], batch_wait_timeout_s=BATCH["batch_wait_timeout_s"])
    async def batched(self, payloads: list[dict]) -> list[dict]:
        rows = [torch.tensor(p["pixels"], dtype=torch.float32) for p in payloads]
        with torch.inference_mode():
            out = self.model.net(torch.cat(rows)).argmax(-1).tolist()
        answers, at = [], 0
        for r in rows:
            answers.append({"digit": out[at : at + len(r)]})
            at += len(r)
        return answers


class HandSplit:
    """The ingress: a weighted choice between two handles; with ``shadow``, a copy to the other."""

    def __init__(self, a, b, weight_a: float, shadow: bool) -> None:
        self.a, self.b, self.weight_a, self.shadow = a, b, weight_a, shadow
        self.tasks: set = set()

    async def __call__(self, request) -> dict:
        payload = await request.json()
        if self.shadow:
            task = asyncio.get_running_loop().create_task(self._mirror(payload))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return await self.a.remote(payload)
        return await (self.a if random.random() < self.weight_a else self.b).remote(payload)

    async def _mirror(self, payload: dict) -> None:
        await self.b.remote(payload)


def hand_app(registry: str, shadow: bool):
    model = serve.deployment(HandModel).options(ray_actor_options=SMALL, max_ongoing_requests=MAX_ONGOING)
    a = model.options(name="production").bind("digits@production", registry)
    b = model.options(name="candidate").bind("digits@candidate", registry)
    ingress = serve.deployment(HandSplit).options(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
    return ingress.bind(a, b, 1.0 if shadow else 0.9, shadow)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6, help="per side, load and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16, help="connections of the saturating load")
    parser.add_argument("--light", type=int, default=1, help="connections of the light load")
    parser.add_argument("--rate", type=float, default=50, help="requests/s of the paced client")
    args = parser.parse_args()
    if loadgen.available() is None:
        sys.exit("wrk is not installed: apt-get install wrk (`make tools` does it)")
    registry = str(Path(tempfile.mkdtemp(prefix="model-server-bench-")) / "registry")
    rm.init(num_cpus=2)
    for seed, alias in ((0, "production"), (1, "candidate")):
        torch.manual_seed(seed)
        model = DigitsNet()
        model.ensure_setup()
        rm.registry.open(registry).put(model, "digits", alias=alias)
    X, _ = load_data()
    body = {"pixels": X[:1].astype(np.float32).tolist()}
    # No batch wait: at a light load a request would wait it out alone (the hand-written side does not batch);
    # requests that queue up under load are still batched.
    settings = {"ray_actor_options": SMALL, "max_ongoing_requests": MAX_ONGOING, **BATCH}
    ours = {
        "raymodel one version": rm.Servable("digits@production", "/one", settings=settings, registry=registry),
        "raymodel split": rm.Servable(
            {"digits@production": 0.9, "digits@candidate": 0.1}, "/split", settings=settings, registry=registry
        ),
        "raymodel shadow": rm.Servable(
            "digits@production", "/shadow", settings=settings, registry=registry, shadow="digits@candidate"
        ),
    }
    urls = {name: s.deploy().url for name, s in ours.items()}
    base = urls["raymodel one version"].rsplit("/", 1)[0]
    for name, route, shadow in (
        ("hand-written split", "/hand-split", False),
        ("hand-written shadow", "/hand-shadow", True),
    ):
        serve.run(hand_app(registry, shadow), name=route.strip("/"), route_prefix=route)
        urls[name] = base + route
    for url in urls.values():  # warm: every version loaded, HAProxy up to date
        loadgen.wrk(url, body, connections=2, seconds=1)
    paced = {name: [] for name in urls}
    for _ in range(args.rounds):
        for name, url in urls.items():
            paced[name] += _paced(url, body, args.rate, args.seconds)
    print(f"\npaced load: one client, {args.rate:g} requests/s, {args.rounds} x {args.seconds:g} s per side")
    print(f"  {'side':24s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for name, latencies in paced.items():
        latencies.sort()
        print(f"  {name:24s} {_q(latencies, 0.5):8.2f} {_q(latencies, 0.99):8.2f}")
    for a, b in (("raymodel shadow", "raymodel split"), ("hand-written shadow", "hand-written split")):
        print(
            f"  {a} / {b}: p50 {_q(paced[a], 0.5) / _q(paced[b], 0.5):.2f}x, "
            f"p99 {_q(paced[a], 0.99) / _q(paced[b], 0.99):.2f}x"
        )
    for load, connections in (("light", args.light), ("saturating", args.clients)):
        runs: dict[str, list[dict]] = {name: [] for name in urls}
        for _ in range(args.rounds):
            for name, url in urls.items():
                runs[name].append(
                    loadgen.wrk(url, body, connections=connections, threads=min(2, connections), seconds=args.seconds)
                )
        print(f"\n{load} load: {connections} connection(s), {args.rounds} x {args.seconds:g} s per side")
        print(f"  {'side':24s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>7s}")
        for name, rs in runs.items():
            errors = sum(r["non_2xx"] + r["socket_errors"] for r in rs)
            print(
                f"  {name:24s} {median(r['rps'] for r in rs):8.0f} {median(r['p50_ms'] for r in rs):8.2f} "
                f"{median(r['p99_ms'] for r in rs):8.2f} {errors:7d}"
            )

        for a, b in (
            ("raymodel split", "hand-written split"),
            ("raymodel shadow", "hand-written shadow"),
            ("raymodel shadow", "raymodel split"),
            ("raymodel split", "raymodel one version"),
            ("hand-written shadow", "hand-written split"),
        ):
            print(
                f"  {a} / {b}: req/s {_ratio(runs, a, b, 'rps'):.2f}x, p50 {_ratio(runs, a, b, 'p50_ms'):.2f}x, "
                f"p99 {_ratio(runs, a, b, 'p99_ms'):.2f}x"
            )
        if load == "saturating":
            ratio = _ratio(runs, "raymodel split", "raymodel one version", "rps")
            verdict = "met" if ratio >= 0.8 else "NOT met"
            print(
                f"  (internal) split route / one-version route, saturated: {ratio:.2f}x req/s (goal >= 0.8x: {verdict})"
            )


def _paced(url: str, body: dict, rate: float, seconds: float) -> list[float]:
    """One client sending a request every ``1/rate`` s (not when the last is answered): the latency a
    client sees when the route is not saturated. Milliseconds."""
    latencies = []
    with requests.Session() as session:
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            time.sleep(max(0.0, start + i / rate - time.perf_counter()))
            began = time.perf_counter()
            session.post(url, json=body, timeout=30).raise_for_status()
            latencies.append(1000 * (time.perf_counter() - began))
    return latencies


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ratio(runs: dict[str, list[dict]], a: str, b: str, key: str) -> float:
    """Median over the rounds of a / b: a slow spell of the shared machine lands on both alike."""
    return median(x[key] / y[key] for x, y in zip(runs[a], runs[b]))


if __name__ == "__main__":
    main()
