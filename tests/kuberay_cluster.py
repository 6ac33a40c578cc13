"""A RayCluster that ``raymodel k8s cluster`` writes, formed as KubeRay's operator forms it, without
Kubernetes (tests/test_kubernetes.py runs it): its head's and its worker group's ``rayStartParams``
given to ``ray start`` with each container's environment, the head's ``postStart`` command run once Ray
runs there, the worker in a network namespace of its own (another pod's address, reaching the head only
over its veth link), the storage on moto's S3 server.

What the operator adds of its own, as it does: ``--head``, the node's address (the pod's IP), ports,
``--num-cpus`` from the container's CPU limit, ``--address`` of the head for a worker, ``--block`` (here:
not, the processes end with the test), and the token of ``authOptions`` (``RAY_AUTH_MODE``,
``RAY_AUTH_TOKEN``) in every Ray container.

Prints one ``RESULT`` JSON line of what the test checks.

    python tests/kuberay_cluster.py <scratch dir>   (as root)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import lane  # noqa: E402
from off_cluster import BIN, MARK, Network  # noqa: E402
from s3server import ENV as S3_ENV, S3Server, free_port  # noqa: E402
from waiting import until  # noqa: E402


def container_env(container: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """A container's environment as the kubelet gives it: ``env`` values, ``valueFrom`` a Secret's key,
    ``envFrom`` each key of a Secret."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(secrets[source["secretRef"]["name"]])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def start_params(group: dict[str, Any]) -> list[str]:
    """A group's ``rayStartParams`` as ``ray start`` options, and ``--num-cpus`` from its container's CPU limit."""
    options = [f"--{key}={value}" for key, value in group["rayStartParams"].items()]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    return [*options, f"--num-cpus={int(float(limits['cpu']))}"]


def main() -> None:
    scratch = Path(sys.argv[1])
    with Network(routed=True) as network, S3Server(host=network.host) as s3:
        out = subprocess.run(
            [
                str(BIN / "raymodel"),
                "k8s",
                "cluster",
                "--name",
                "digits-cluster",
                "--image",
                "raymodel:test",
                "--storage",
                s3.uri("home"),
                "--workers",
                "1",
                "--worker-cpus",
                "1",
                "--head-cpus",
                "1",
                "--storage-secret",
                "s3-credentials",
                "--warm",
                "none",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        manifest = yaml.safe_load(out.stdout)
        spec = manifest["spec"]
        head_group, (worker_group,) = spec["headGroupSpec"], spec["workerGroupSpecs"]
        head_box, worker_box = (
            head_group["template"]["spec"]["containers"][0],
            worker_group["template"]["spec"]["containers"][0],
        )
        secrets = {"s3-credentials": dict(S3_ENV)}
        token = uuid.uuid4().hex  # what the operator's Secret of authOptions holds
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if spec["authOptions"]["mode"] == "token" else {}
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYMODEL_", "AWS_"))}
        base["PATH"] = f"{BIN}{os.pathsep}{base.get('PATH', '')}"  # the image's `raymodel` and `ray`
        head_mark, worker_mark = uuid.uuid4().hex, uuid.uuid4().hex
        head_env = {**base, **container_env(head_box, secrets), **auth, MARK: head_mark}
        worker_env = {**base, **container_env(worker_box, secrets), **auth, MARK: worker_mark}
        gcs, dashboard = free_port(), free_port()
        address = f"{network.host}:{gcs}"
        try:
            head = [
                str(BIN / "ray"),
                "start",
                "--head",
                f"--node-ip-address={network.host}",
                f"--port={gcs}",
                f"--dashboard-port={dashboard}",
                f"--temp-dir={scratch / 'head'}",
                *start_params(head_group),
            ]
            done = subprocess.run(head, env=head_env, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            hook = head_box["lifecycle"]["postStart"]["exec"]["command"]
            hooked = subprocess.run(
                hook, env={**head_env, "RAY_ADDRESS": address}, capture_output=True, text=True, timeout=300
            )
            server_log = (
                Path("/tmp/raymodel-server.log").read_text() if Path("/tmp/raymodel-server.log").exists() else ""
            )
            assert hooked.returncode == 0, hooked.stdout + hooked.stderr + server_log
            worker = [
                "ip",
                "netns",
                "exec",
                network.name,
                str(BIN / "ray"),
                "start",
                f"--address={address}",
                f"--node-ip-address={network.client}",
                f"--temp-dir={scratch / 'worker'}",
                *start_params(worker_group),
            ]
            done = subprocess.run(worker, env=worker_env, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            os.environ.update({k: v for k, v in head_env.items() if k.startswith(("RAY_AUTH", "AWS_"))})
            result = formed(address, network.client, server_log)
        finally:
            import ray

            ray.shutdown()
            lane.end_marked(worker_mark, grace_s=2.0, variables=(MARK,))
            lane.end_marked(head_mark, variables=(MARK,))
    print("RESULT " + json.dumps(result), flush=True)


def formed(address: str, worker_ip: str, server_log: str) -> dict[str, Any]:
    """What the cluster is once formed: its nodes, the training server, a task on the worker's node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    until(lambda: sum(node["Alive"] for node in ray.nodes()) == 2, 60)
    nodes = {node["NodeManagerAddress"]: node for node in ray.nodes() if node["Alive"]}
    server = ray.get_actor("raymodel-job-server", namespace="raymodel")
    jobs = ray.get(server.list.remote(), timeout=60)

    @ray.remote(num_cpus=1)
    def where() -> tuple[str, str | None]:
        return ray.util.get_node_ip_address(), os.environ.get("RAYMODEL_HOME")

    far = nodes[worker_ip]["NodeID"]
    ip, home = ray.get(where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(far, soft=False)).remote())
    return {
        "head": address.rsplit(":", 1)[0],
        "worker": worker_ip,
        "nodes": sorted(nodes),
        "cpus": {ip_: node["Resources"].get("CPU") for ip_, node in nodes.items()},
        "jobs": [job["id"] for job in jobs],
        "task_ran_on": ip,
        "worker_home": home,
        "server_log": server_log,
    }


if __name__ == "__main__":
    main()
