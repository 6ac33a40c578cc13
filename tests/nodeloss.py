"""Runs that lose a node, in their own process and Ray cluster (tests/test_scheduling.py runs it).

A head with no CPUs (the driver's node, where the training server runs) and two
1-CPU worker nodes, from ``ray.cluster_utils.Cluster``:

* ``rescheduling``: a placement group over both nodes loses one: what the server says a
  worker group in that state waits for ("1 more CPU for 1 worker of 2").
* ``elastic``: ``num_workers=(1, 2)``; a node is removed after epoch 3: the run
  continues on one worker; a node is added: it grows back to two.
* ``fixed``: two workers on a pool; a node is removed after epoch 3: the job says
  what it waits for; a node is added: it resumes and finishes.
* ``stop_waiting``: the same, and ``job.stop()`` while it waits: STOPPED at once, with its
  newest checkpoint.
* ``give_up``: the same with ``resource_wait_s=4`` and no node added: it fails,
  naming what was missing.

Prints one ``RESULT`` JSON line per scenario with what the test checks.

    RAYMODEL_HOME=<dir> python tests/nodeloss.py <tmp dir> elastic fixed
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from waiting import until

import raymodel as rm


class Paced(rm.Callback):
    """Epochs of about ``seconds``: time to take a node away between two of them."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def after_epoch(self, epoch, metrics):
        time.sleep(self.seconds)


def epochs(job) -> int:
    return len(job.history())


def reached(job, epoch: int) -> bool:
    """Whether ``job`` has ended its ``epoch``-th epoch; an ``AssertionError`` saying why when it ended
    before it (a wait for an epoch that cannot come fails at once, with the job's own words)."""
    if epochs(job) >= epoch:
        return True
    if job.status not in ("PENDING", "RUNNING"):
        raise AssertionError(f"{job.id} ended {job.status} before epoch {epoch}: {job.error}\n{job.logs()}")
    return False


def sizes(job) -> list[int]:
    return [row.get("world_size") for row in job.history()]


def tell(job) -> None:
    """What holds the cluster's resources, on stderr (the test shows its end: the job's log comes last)."""
    import ray
    from ray.util.state import list_actors, list_placement_groups

    address = ray.get_runtime_context().gcs_address
    groups = list_placement_groups(address, detail=True)
    print([(g.state, [b["node_id"][:6] for b in g.bundles]) for g in groups], file=sys.stderr)
    print([(a.class_name, a.state) for a in list_actors(address)], file=sys.stderr)
    print(rm.jobs.pools(), ray.available_resources(), file=sys.stderr)
    if job is not None:
        print(job.status, job.reason, job.logs(), file=sys.stderr)


def main() -> None:
    import ray
    from clusters import agent_ports, head_args
    from models import TinyNet
    from ray.cluster_utils import Cluster

    scratch, scenarios = Path(sys.argv[1]), sys.argv[2:]
    cluster = Cluster(initialize_head=True, head_node_args=head_args(scratch))
    count = [0]

    def add_node():
        count[0] += 1
        node = cluster.add_node(num_cpus=1, temp_dir=str(scratch / f"node-{count[0]}"), **agent_ports())
        cluster.wait_for_nodes()
        return node

    nodes = [add_node(), add_node()]
    rm.init(address=cluster.address, verbose=False)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 4)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    data = rm.data.from_numpy(X, y, valid_fraction=0.25)
    base = {"batch_size": 4, "progress": False, "callbacks": [Paced(1.0)], "max_failures": 3}

    for scenario in scenarios:
        if scenario == "rescheduling":
            # A worker group that lost a node waits only for the bundle it lost (Ray: RESCHEDULING):
            # what the server says it waits for still names the group's size.
            from ray.util.placement_group import placement_group, remove_placement_group

            from raymodel.jobs._pools.keeper import pending_groups
            from raymodel.jobs._server.control import _unplaced

            group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
            ray.get(group.ready(), timeout=60)
            cluster.remove_node(nodes.pop())
            waiting = until(pending_groups, 60, 0.2)
            said = _unplaced(waiting)
            remove_placement_group(group)
            nodes.append(add_node())
            print("RESULT", json.dumps({"scenario": scenario, "waiting": waiting, "said": said}), flush=True)
        elif scenario == "elastic":
            # `elastic_wait_s`: how long it waits for a worker group of its size before it shrinks.
            settings = {**base, "num_workers": (1, 2), "num_epochs": 60, "elastic_resize_s": 2, "elastic_wait_s": 20}
            job = TinyNet().train(settings, data=data, wait=False)
            until(lambda job=job: reached(job, 3), 180)
            cluster.remove_node(nodes.pop())
            until(lambda job=job: sizes(job)[-1:] == [1], 150)
            nodes.append(add_node())
            until(lambda job=job: sizes(job)[-1:] == [2], 150)
            job.update(settings={"num_epochs": epochs(job) + 2})  # enough: end soon
            job.wait(timeout=120)
            print("RESULT", json.dumps({"scenario": scenario, "history": job.history(), "log": job.logs()}), flush=True)
        elif scenario == "fixed":
            job = TinyNet().train({**base, "num_workers": 2, "num_epochs": 8}, data=data, wait=False)
            until(lambda job=job: reached(job, 3), 180)
            lost_at = time.monotonic()
            cluster.remove_node(nodes.pop())
            try:
                reason = until(lambda job=job: (job.reason or "").startswith("waiting for") and job.reason, 60, 0.1)
            except AssertionError:
                print(job.logs(), rm.jobs.pools(), file=sys.stderr)
                raise
            said_after = time.monotonic() - lost_at
            time.sleep(3)
            still = job.status, epochs(job)
            nodes.append(add_node())
            job.wait(timeout=240)
            print(
                "RESULT",
                json.dumps(
                    {
                        "scenario": scenario,
                        "reason": reason,
                        "said_after": said_after,
                        "while_waiting": still,
                        "history": job.history(),
                        "log": job.logs(),
                    }
                ),
                flush=True,
            )
        elif scenario == "stop_waiting":  # a job waiting for a lost node is stopped: it ends at once
            job = TinyNet().train({**base, "num_workers": 2, "num_epochs": 50}, data=data, wait=False)
            until(lambda job=job: reached(job, 2), 180)
            cluster.remove_node(nodes.pop())
            until(lambda job=job: (job.reason or "").startswith("waiting for"), 60, 0.1)
            asked = time.monotonic()
            job.stop()
            result = job.wait(timeout=60)
            took = time.monotonic() - asked
            nodes.append(add_node())
            print(
                "RESULT",
                json.dumps(
                    {
                        "scenario": scenario,
                        "status": job.status,
                        "took": took,
                        "checkpoint": result.checkpoint if result else None,
                        "epochs": epochs(job),
                    }
                ),
                flush=True,
            )
        elif scenario == "give_up":
            # From a cluster at rest: the run of the job stopped while it waited has ended, and nothing
            # of it (its pool, a worker group Ray placed once the node came back) holds a CPU.
            try:
                until(lambda: ray.available_resources().get("CPU", 0.0) >= 2.0, 120)
            except AssertionError:
                tell(None)
                raise
            settings = {**base, "num_workers": 2, "num_epochs": 50, "resource_wait_s": 4}
            job = TinyNet().train(settings, data=data, wait=False)
            try:
                until(lambda job=job: reached(job, 1), 180)
            except AssertionError:
                tell(job)
                raise
            lost_at = time.monotonic()
            cluster.remove_node(nodes.pop())
            try:
                job.wait(timeout=120)
                error = None
            except rm.exceptions.TrainingError as exc:
                error = str(exc)
            took = time.monotonic() - lost_at
            print("RESULT", json.dumps({"scenario": scenario, "error": error, "took": took}), flush=True)
    rm.jobs.release_pools()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
