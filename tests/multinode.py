"""The multi-node scenario of tests/test_storage.py, run in its own process (its own Ray).

A head node with no CPUs for work (the driver's node) and two worker nodes,
each with its own temporary directory, from Ray's ``ray.cluster_utils.Cluster``.
Every location is on the S3 server named by ``RAYMODEL_HOME``: train on two
workers, tune two trials, register the best and serve it by alias. Prints one
JSON line with what the test checks.

    RAYMODEL_HOME=s3://... python tests/multinode.py <tmp dir> <http port>
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).parent))

import raymodel as rm
from raymodel._internal import locations, storage
from raymodel._ray import ingress


def main() -> None:
    import ray
    from clusters import agent_ports, head_args
    from models import DigitsNet
    from ray import serve
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors
    from sklearn.datasets import load_digits

    scratch, port = Path(sys.argv[1]), int(sys.argv[2])
    # Ports of its own: the test session's Ray instance may be running beside it (and so may its
    # HAProxy: this cluster's Serve gets its own stats and metrics ports, as `rm.init` would give it).
    os.environ.update(ingress.with_serve_env(os.environ, ingress.resolve_ingress(None)))
    cluster = Cluster(initialize_head=True, head_node_args=head_args(scratch))
    for name in ("a", "b"):
        cluster.add_node(
            num_cpus=2, temp_dir=str(scratch / f"node-{name}"), resources={f"node_{name}": 1}, **agent_ports()
        )
    cluster.wait_for_nodes()
    rm.init(address=cluster.address)
    head = ray.get_runtime_context().get_node_id()

    X, y = load_digits(return_X_y=True)
    data = rm.data.from_numpy((X / 16.0).astype(np.float32), y, valid_fraction=0.2)
    model = DigitsNet(config={"lr": 1e-2})
    trained = model.train(
        {"num_workers": 2, "num_epochs": 2, "batch_size": 64, "progress": False, "callbacks": [NodeLog()]}, data=data
    )
    tuned = DigitsNet().tune(
        {"lr": rm.tune.grid_search([3e-3, 1e-2])},
        data=data,
        settings={
            "num_samples": 1,
            "max_epochs": 2,
            "scheduler": "fifo",
            "progress": False,
            "train": {
                "resources_per_worker": {"CPU": 1},
                "batch_size": 64,
                "progress": False,
                "callbacks": [NodeLog()],
            },
        },
    )
    ref = rm.registry.put(tuned, key="digits", alias="production")

    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    served = rm.Servable("digits@production", "/digits").deploy()
    valid = data.splits["valid"]
    answer = requests.post(served.url, json={"pixels": valid.x[:4].tolist()}, timeout=60)
    replicas = [
        r["node_id"]
        for r in list_actors(filters=[("state", "=", "ALIVE")], detail=True)
        if "ServeReplica" in r["class_name"]
    ]
    served.shutdown()

    # The trained instance itself: its weights go to a serve checkpoint under RAYMODEL_HOME (on S3),
    # which the replica on a worker node loads; a redeploy replaces it, a shutdown removes it.
    direct = model.serve("/direct")
    first = storage.listdir(locations.home_path("serve", "direct"))
    again = model.serve("/direct")
    second = storage.listdir(locations.home_path("serve", "direct"))
    direct_status = requests.post(again.url, json={"pixels": valid.x[:2].tolist()}, timeout=60).status_code
    again.shutdown()
    serve_checkpoints = [first, second, storage.listdir(locations.home_path("serve", "direct"))]
    del direct

    sizes = two_sizes(data)

    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    print(
        "RESULT",
        json.dumps(
            {
                "head": head,
                "nodes": sorted(nodes),
                "train_checkpoint": trained.checkpoint,
                "train_path": trained.path,
                "tune_best": tuned.best_checkpoint,
                "tune_path": tuned.path,
                "ref": str(ref),
                "status": answer.status_code,
                "answer": answer.json(),
                "labels": valid.y[:4].tolist(),
                "replica_nodes": replicas,
                "worker_nodes": sorted(set(NodeLog.read())),
                "trial_paths": [t["path"] for t in tuned.trials],
                "serve_checkpoints": serve_checkpoints,
                "direct_status": direct_status,
                "two_sizes": sizes,
            }
        ),
        flush=True,
    )
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


def two_sizes(data: rm.data.DataSpec) -> dict:
    """Warm pools of 2 and 1 torch workers (``auto``'s where the CPUs hold both: these nodes' 4 do): the
    second starts once the first is ready, and a 1-worker job after a 2-worker one takes its own."""
    import ray
    from models import DigitsNet

    rm.jobs.release_pools()
    started = ray.get(rm.jobs.server().warm.remote([("torch", 2), ("torch", 1)]))
    first = [(p.num_workers, p.state) for p in rm.jobs.pools()]
    rm.jobs.wait_warm([("torch", 2), ("torch", 1)], timeout_s=300)
    warm = {p.num_workers: p.id for p in rm.jobs.pools()}
    logs = {}
    for workers in (2, 1):
        DigitsNet().train({"num_workers": workers, "num_epochs": 1, "batch_size": 64, "progress": False}, data=data)
        logs[workers] = rm.jobs.get(rm.jobs.records()[-1]["id"]).logs()
    after = sorted((p.num_workers, p.id, p.jobs_run) for p in rm.jobs.pools())
    ray.get(rm.jobs.server().warm.remote([]))
    return {
        "started": len(started),
        "first": first,
        "took_own": {n: f"started on pool {warm[n]}" in logs[n] and " starting pool " not in logs[n] for n in warm},
        "after": [(n, pool_id == warm[n], jobs) for n, pool_id, jobs in after],
    }


class NodeLog(rm.Callback):
    """Records, from every training process (Train worker or Tune trial), the node it runs on, on S3."""

    def after_epoch(self, epoch, metrics):
        import ray

        fs, path = storage.filesystem(locations.home_path("nodes"))
        with fs.open_output_stream(f"{path}/{os.getpid()}-{ray.get_runtime_context().get_node_id()}"):
            pass

    @staticmethod
    def read() -> list[str]:
        return [name.split("-", 1)[1] for name in storage.listdir(locations.home_path("nodes"))]


if __name__ == "__main__":
    main()
