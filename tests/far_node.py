"""A worker node on another machine joins ``raymodel server start``'s head (tests/test_off_cluster.py
runs it): the node in a network namespace of its own (tests/off_cluster.py's ``Network``), reaching
the head only over its veth link, the cluster's storage on moto's S3 server.

1. ``raymodel server start --host HEAD --num-cpus 1``: a head other machines reach.
2. ``ray start --address HEAD:PORT --num-cpus 1`` in the namespace (as a second machine runs it).
3. A job of 2 workers (1 CPU each) on a pool: one worker on each machine, the run trains.
4. After its third epoch the far machine is lost (its processes killed at once): the job says what
   it waits for; a node started there again, the job resumes from its newest checkpoint and ends
   SUCCEEDED, each epoch once.

Prints one ``RESULT`` JSON line of what the test checks.

    python tests/far_node.py <scratch dir>   (as root)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import lane  # noqa: E402
from off_cluster import BIN, MARK, Network  # noqa: E402
from s3server import ENV as S3_ENV, S3Server, free_port  # noqa: E402
from waiting import until  # noqa: E402


def node_ips() -> list[str]:
    """The node IPs where the training workers of this head run now."""
    import ray
    from ray.util.state import list_actors, list_nodes

    address = ray.get_runtime_context().gcs_address
    ips = {n.node_id: n.node_ip for n in list_nodes(address)}
    workers = list_actors(address, filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    return sorted(ips.get(w.node_id, "?") for w in workers)


def main() -> None:
    scratch = Path(sys.argv[1])
    with Network(routed=True) as network, S3Server(host=network.host) as s3:
        head_mark, node_mark = uuid.uuid4().hex, uuid.uuid4().hex
        ports = [str(free_port()), str(free_port())]
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYMODEL_"))},
            **S3_ENV,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": os.urandom(16).hex(),
            "RAYMODEL_HOME": s3.uri("home"),
            "RAYMODEL_SERVER_FILE": str(scratch / "server.json"),
            "RAYMODEL_WARM": "none",
        }
        os.environ.update(env)  # this process attaches to the head as a driver of its own

        def far_node(n: int) -> None:
            command = [
                "ip", "netns", "exec", network.name, str(BIN / "ray"), "start",
                f"--address={network.host}:{ports[0]}", f"--node-ip-address={network.client}", "--num-cpus=1",
                f"--temp-dir={scratch / f'far-{n}'}", "--disable-usage-stats",
            ]  # fmt: skip
            out = subprocess.run(command, env={**env, MARK: node_mark}, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]

        try:
            cli = [sys.executable, "-m", "raymodel.cli", "server", "start", "--host", network.host]
            cli += ["--port", ports[0], "--dashboard-port", ports[1], "--num-cpus", "1"]
            started = subprocess.run(cli, env={**env, MARK: head_mark}, capture_output=True, text=True, timeout=300)
            assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
            far_node(1)
            result = run(network, far_node, node_mark, started.stdout)
        finally:
            import ray

            ray.shutdown()  # before its head ends: a driver whose GCS went first aborts, its error unsaid
            lane.end_marked(node_mark, grace_s=2.0, variables=(MARK,))
            lane.end_marked(head_mark, variables=(MARK,))
    print("RESULT " + json.dumps(result), flush=True)


def run(network: Network, far_node, node_mark: str, said: str) -> dict:
    import ray
    from models import TinyNet
    from nodeloss import Paced, epochs, reached

    import raymodel as rm

    rm.init()  # attaches to `raymodel server start`'s head, by its server file
    until(lambda: len(ray.nodes()) >= 2 and sum(n["Alive"] for n in ray.nodes()) == 2, 60)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 4)).astype(np.float32)
    data = rm.data.from_numpy(X, (X[:, 0] > 0).astype(np.int64), valid_fraction=0.25)
    settings = {"num_workers": 2, "num_epochs": 7, "batch_size": 4, "progress": False, "callbacks": [Paced(1.0)]}
    job = TinyNet().train({**settings, "max_failures": 3}, data=data, wait=False)
    until(lambda: reached(job, 2), 240)
    spread = node_ips()  # one worker on each machine
    until(lambda: reached(job, 3), 120)
    for pid in lane.marked(node_mark, variables=(MARK,)):  # the machine is lost: nothing ends gently
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lost_at = epochs(job)
    reason = until(lambda: (job.reason or "").startswith("waiting for") and job.reason, 120, 0.2)
    far_node(2)
    job.wait(timeout=300)
    return {
        "said": said,
        "spread": spread,
        "far": network.client,
        "head": network.host,
        "lost_at": lost_at,
        "reason": reason,
        "status": job.status,
        "error": job.error,
        "epochs": [row["epoch"] for row in job.history()],
        "log": job.logs()[-3000:],
    }


if __name__ == "__main__":
    main()
