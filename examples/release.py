"""Releases: from data to production in one job, while a client keeps calling the route.

A first version goes to production (a first release: nothing to beat), is served at `/digits`,
then a better candidate is released through the gate and a guarded rollout (promoted), and a
worse one is turned away at the gate (rejected, nothing touched). Each release's stages are
printed as a timeline.

    python examples/release.py
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsNet, load_data as load_arrays

import raymodel as rm

SETTINGS = {"num_workers": 1, "num_epochs": 4, "batch_size": 32, "progress": False}
GATE = rm.Gate(metric="val_acc", mode="max", min_delta=0.0, against="digits@production")


class Client:
    """Posts a request to the route, one after another, and counts the answers by status and version."""

    def __init__(self, url: str, body: dict) -> None:
        self.url, self.body, self.seen, self.stopped = url, body, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with requests.Session() as session:
            while not self.stopped.is_set():
                answer = session.post(self.url, json=self.body, timeout=30)
                seen = (answer.status_code, answer.headers.get("x-raymodel-model"))
                self.seen[seen] = self.seen.get(seen, 0) + 1

    def stop(self) -> dict:
        self.stopped.set()
        self.thread.join()
        return self.seen


def timeline(result: rm.ReleaseResult) -> None:
    start = result.stages[0]["start"] if result.stages else 0.0
    for row in result.stages:
        print(f"  {row['stage']:<9} {row['start'] - start:6.1f} s -> {row['end'] - start:6.1f} s", end="")
        if row["stage"] == "evaluate":
            print(f"  {row['reason']}")
        elif row["stage"] in ("register", "rollout"):
            print(f"  {row.get('version') or row.get('reason')}")
        else:
            print()
    print(f"  => {result.status}: {result.reason}")


def main() -> None:
    X, y = load_arrays()
    data = rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)
    rm.init(num_cpus=2)
    registry = rm.registry.open()

    print("== a first release: nothing in production yet, so the gate passes ==")
    first = DigitsNet(config={"hidden": 32, "lr": 3e-4}).release(
        data=data, settings={**SETTINGS, "num_epochs": 1}, register="digits@production", gate=GATE
    )
    timeline(first)

    served = rm.Servable("digits@production", "/digits", settings={"ray_actor_options": {"num_cpus": 0.25}}).deploy()
    client = Client(served.url, {"pixels": X[:1].tolist()})
    try:
        print("== a better candidate: scored against production, rolled out in two steps, promoted ==")
        job = DigitsNet(config={"hidden": 128, "lr": 3e-3}).release(
            data=data,
            settings=SETTINGS,
            register="digits",
            gate=GATE,
            route="/digits",
            rollout=rm.RolloutPlan(steps=(0.5, 1.0), step_s=3, guard=rm.Guard(max_error_rate=0.01, min_requests=20)),
            wait=False,  # the Job at once: this script watches its stage
        )
        while job.status in ("PENDING", "RUNNING"):
            print(f"  ... {job.stage}")
            time.sleep(5)
        timeline(job.wait())

        print("== a worse candidate: rejected at the gate, the route and the alias untouched ==")
        worse = DigitsNet(config={"hidden": 8, "lr": 1e-5}).release(
            data=data, settings={**SETTINGS, "num_epochs": 1}, register="digits", gate=GATE, route="/digits"
        )
        timeline(worse)
    finally:
        seen = client.stop()
        served.shutdown()
    print("answers the client got (status, version):", dict(sorted(seen.items(), key=str)))
    print("digits@production is", registry.show("digits", "production"))


if __name__ == "__main__":
    main()
