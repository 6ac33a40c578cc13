"""The chaos test of the durable training server, in its own process and Ray head
(``raymodel server start``, 2 CPUs); tests/test_durable.py runs it.

1. A head restart with one running and one queued job (``raymodel server stop --grace-s 0`` / ``start``):
   both end SUCCEEDED, the running one resumed from its newest checkpoint.
2. A queue of jobs (training on pools, a one-off run, a tune job, one that is stopped) through
   kills at random moments, in a seeded random order: the server actor (Ray restarts it), a
   pool's training worker (Ray Train restarts the worker group), and the whole head.

At the end every job must have ended SUCCEEDED (STOPPED where stopped), each epoch once in its
history (each trial's, for the tune job), every record once, and nothing left behind (job folders,
CPUs). Prints what it did, and one ``RESULT`` JSON line per part.

    RAYMODEL_HOME=<dir> RAYMODEL_SERVER_FILE=<file> python tests/chaos.py <scratch> <seed> <kills>
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from waiting import until

import raymodel as rm

CLI = [sys.executable, "-m", "raymodel.cli"]


def cli(*args: str) -> str:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def start(ports: list[str]) -> None:
    cli("server", "start", "--port", ports[0], "--dashboard-port", ports[1], "--num-cpus", "2")
    rm.init()  # attaches to `raymodel server start`


def restart_head(ports: list[str]) -> float:
    """``raymodel server stop --grace-s 0`` then ``start``: the head goes down at once, its running
    jobs mid-epoch (no drain: that is the lane's server_start test), as a head that dies; returns how
    long until the server answered again."""
    import ray

    ray.shutdown()
    cli("server", "stop", "--grace-s", "0")
    began = time.monotonic()
    start(ports)
    rm.jobs.list()
    return time.monotonic() - began


def kill_server() -> float:
    import ray

    from raymodel.jobs._address import NAME, NAMESPACE

    began = time.monotonic()
    ray.kill(ray.get_actor(NAME, namespace=NAMESPACE), no_restart=False)  # Ray restarts it
    rm.jobs.list()
    return time.monotonic() - began


def kill_worker() -> bool:
    """SIGKILL one training worker (its process), once one runs (within a minute)."""
    import ray
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address  # this head's, with the test session's Ray beside it

    def alive() -> list:
        return list_actors(address, filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])

    try:
        workers = until(alive, 60, 0.5)
        os.kill(int(random.choice(workers).pid), signal.SIGKILL)
    except (AssertionError, ProcessLookupError, TypeError, ValueError):
        return False
    return True


def epochs_once(history: list[dict]) -> bool:
    """Each epoch once, in order (per trial for a tune job)."""
    by_trial: dict[str, list[int]] = {}
    for row in history:
        by_trial.setdefault(row.get("trial_id", ""), []).append(int(row["epoch"]))
    return all(seen == list(range(1, len(seen) + 1)) for seen in by_trial.values())


def main() -> None:
    import ray
    from models import SlowNet
    from s3server import free_port

    seed, kills = int(sys.argv[2]), int(sys.argv[3])
    random.seed(seed)
    ports = [str(free_port()), str(free_port())]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 4)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    data = rm.data.from_numpy(X, y, valid_fraction=0.25)
    base = {"batch_size": 8, "progress": False, "max_failures": 10}
    start(ports)

    # 1. A head restart: one job running, one queued behind it.
    running = SlowNet().train({**base, "num_workers": 2, "num_epochs": 6}, data=data, wait=False)
    queued = SlowNet().train({**base, "num_workers": 2, "num_epochs": 3}, data=data, wait=False)
    until(lambda: len(running.history()) >= 2, 240)
    back = restart_head(ports)
    running, queued = rm.jobs.get(running.id), rm.jobs.get(queued.id)
    results = {job.id: job.wait(timeout=300) for job in (running, queued)}
    print(
        "RESULT",
        json.dumps(
            {
                "part": "head",
                "back_s": back,
                "statuses": [running.status, queued.status],
                "epochs": [[r["epoch"] for r in results[j].history] for j in (running.id, queued.id)],
                "logs": [running.logs(), queued.logs()],
            }
        ),
        flush=True,
    )

    # 2. A queue of jobs through random kills.
    jobs = [
        SlowNet().train({**base, "num_workers": 1, "num_epochs": 8}, data=data, wait=False),
        SlowNet().train({**base, "num_workers": 2, "num_epochs": 4}, data=data, wait=False),
        SlowNet().train({**base, "num_workers": 1, "num_epochs": 5, "pool": False}, data=data, wait=False),
        SlowNet().tune(
            {"lr": rm.tune.grid_search([0.05, 0.1])},
            settings={"max_epochs": 3, "num_samples": 1, "train": {**base, "num_workers": 1}, "progress": False},
            data=data,
            wait=False,
        ),
        SlowNet().train({**base, "num_workers": 1, "num_epochs": 40}, data=data, wait=False),  # stopped
    ]
    ids = [job.id for job in jobs]
    plan = random.sample(["server", "worker", "head"] * ((kills + 2) // 3), kills)
    done: dict[str, int] = {"server": 0, "worker": 0, "head": 0}
    back_s: list[float] = []
    for i, kind in enumerate(plan):
        until(lambda: any(j["status"] == "RUNNING" and j["rows"] for j in _records(ids)), 300)
        time.sleep(random.uniform(0.5, 4.0))
        if kind == "server":
            back_s.append(kill_server())
        elif kind == "worker":
            if not kill_worker():
                print(f"kill {i + 1}/{len(plan)}: no worker ran", flush=True)
                continue
        else:
            back_s.append(restart_head(ports))
        done[kind] += 1
        print(f"kill {i + 1}/{len(plan)}: {kind}", flush=True)
        if i == 0:
            rm.jobs.get(ids[-1]).stop()
    outcome = {}
    for job_id in ids:
        job = rm.jobs.get(job_id)
        try:
            job.wait(timeout=600)
        except rm.exceptions.RayModelError as exc:
            print(f"{job_id} failed: {exc}\n{job.logs()}", file=sys.stderr, flush=True)
        record = job._record()
        outcome[job_id] = {
            "status": record["status"],
            "kind": record["kind"],
            "epochs_once": epochs_once(job.history()),
            "rows": len(job.history()),
            "restarts": record.get("restarts", 0),
        }
        if record["status"] not in ("SUCCEEDED", "STOPPED"):  # the test's failure says why
            outcome[job_id].update(error=record.get("error"), log=job.logs()[-4000:])
    listed = [r["id"] for r in rm.jobs.records()]
    rm.jobs.release_pools()
    free = until(lambda: ray.available_resources().get("CPU", 0.0) == 2.0 and 2.0, 120)
    left = sorted(p.name for p in (Path(os.environ["RAYMODEL_HOME"]) / "jobs").iterdir() if p.is_dir())
    print(
        "RESULT",
        json.dumps(
            {
                "part": "chaos",
                "jobs": outcome,
                "kills": done,
                "back_s": back_s,
                "listed": listed,
                "ids": ids,
                "free_cpus": free,
                "left": left,
            }
        ),
        flush=True,
    )
    ray.shutdown()


def _records(ids: list[str]) -> list[dict]:
    return [r for r in rm.jobs.records() if r["id"] in ids]


if __name__ == "__main__":
    try:
        main()
    finally:  # never leave a head behind for the tests after this one
        subprocess.run([*CLI, "server", "stop"], capture_output=True, timeout=120)
