"""A cluster and a client that is not one of its nodes, on one machine: the client in a network
namespace of its own (tests/test_off_cluster.py).

* ``Network``: a namespace and a veth pair, one end in it; the head's address on the outer end, the
  client's on the inner one (``ip netns``, as root: ``make test``'s CI runs as root). The client reaches
  the head only over that link.
* ``Head``: ``ray start --head`` on the outer address, token auth on, ports of its own, its storage
  (``RAYMODEL_HOME``) on moto's S3 server on the same address; every process it starts carries a mark
  of its own, and ``close`` ends them (``ray stop`` would end the test session's Ray too).
* ``client``: ``python tests/off_cluster_client.py SCENARIO...`` in the namespace, with the cluster's
  token, ``RAYMODEL_HOME`` on the S3 server and the user's package (``tests/laptop``) importable only there.

    python tests/off_cluster.py <scratch dir> SCENARIO...   (as root; prints RESULT lines)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(TESTS))

import lane  # noqa: E402
from clusters import clean_env  # noqa: E402
from s3server import ENV as S3_ENV, S3Server, free_port  # noqa: E402

#: The variable that marks the head's processes (its daemons, the training server, its workers).
MARK = "RM_TEST_OFF_CLUSTER"


def missing_tools() -> list[str]:
    """What this machine lacks for a client off the cluster: root, and ``ip`` (iproute2)."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces)"]
    return missing + ([] if shutil.which("ip") else ["ip (iproute2)"])


class Network:
    """A network namespace joined to this one by a veth pair: ``host`` here, ``client`` there (the
    machine off the cluster, or a worker node's)."""

    def __init__(self, routed: bool = False) -> None:
        self.routed = routed  # whether the namespace reaches this side's other addresses too (a default route)
        tag = f"{os.getpid() % 10000}{secrets.token_hex(1)}"
        self.name, self.outer, self.inner = f"rm-{tag}", f"rmh{tag}", f"rmc{tag}"
        subnet = 16 + secrets.randbelow(200)
        self.host, self.client = f"10.214.{subnet}.1", f"10.214.{subnet}.2"

    def __enter__(self) -> Network:
        steps = [
            ["ip", "netns", "add", self.name],
            ["ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner],
            ["ip", "link", "set", self.inner, "netns", self.name],
            ["ip", "addr", "add", f"{self.host}/24", "dev", self.outer],
            ["ip", "link", "set", self.outer, "up"],
            ["ip", "netns", "exec", self.name, "ip", "addr", "add", f"{self.client}/24", "dev", self.inner],
            ["ip", "netns", "exec", self.name, "ip", "link", "set", self.inner, "up"],
            ["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"],
        ]
        if self.routed:
            steps.append(["ip", "netns", "exec", self.name, "ip", "route", "add", "default", "via", self.host])
        try:
            for step in steps:
                subprocess.run(step, check=True, capture_output=True, text=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


class Head:
    """``ray start --head`` on ``host``, token auth on, its storage on an S3 server on ``host``."""

    def __init__(self, host: str, scratch: Path, s3: S3Server, num_cpus: int = 2) -> None:
        self.host, self.scratch, self.s3, self.num_cpus = host, scratch, s3, num_cpus
        self.python = cluster_python(scratch / "cluster-python")
        self.token = secrets.token_hex(16)
        self.mark = uuid.uuid4().hex
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.address = f"http://{host}:{self.dashboard_port}"
        self.serve_port = free_port()  # the routes' port, beside the test session's own
        self.web_port = free_port()  # raymodel's dashboard's
        self.home = s3.uri("home")

    def env(self) -> dict[str, str]:
        return {
            **clean_env(),
            **S3_ENV,
            "PATH": f"{self.python.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # the jobs' `python`
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAYMODEL_HOME": self.home,
            "RAYMODEL_WARM": "none",
            MARK: self.mark,
        }

    def __enter__(self) -> Head:
        ports = {
            "port": self.gcs_port,
            "dashboard-port": self.dashboard_port,
            "dashboard-agent-listen-port": free_port(),
            "dashboard-agent-grpc-port": free_port(),
            "metrics-export-port": free_port(),
            "runtime-env-agent-port": free_port(),
            "node-manager-port": free_port(),
            "object-manager-port": free_port(),
        }
        command = [
            str(self.python),
            "-c",
            "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()",
            "start",
            "--head",
            f"--node-ip-address={self.host}",
            f"--dashboard-host={self.host}",
            f"--num-cpus={self.num_cpus}",
            f"--temp-dir={self.scratch / 'head'}",
            "--disable-usage-stats",
            "--include-dashboard=true",
            *(f"--{name}={port}" for name, port in ports.items()),
        ]
        out = subprocess.run(command, env=self.env(), capture_output=True, text=True, cwd=self.scratch, timeout=120)
        if out.returncode != 0:
            self.__exit__()
            raise RuntimeError(f"ray start failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        return self

    def __exit__(self, *exc: object) -> None:
        lane.end_marked(self.mark, variables=(MARK,))


def cluster_python(folder: Path) -> Path:
    """The cluster's ``python``: a virtual environment of its own (made once) that reads this one's
    packages through a ``.pth`` file. A ``pip`` runtime env makes a virtual environment for the jobs
    that name it; in a virtual environment Ray copies the whole of it first (this one's: 5 GB), where
    a cluster's image has a small one, or none."""
    python = folder / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
        import sysconfig

        ours = sysconfig.get_paths()["purelib"]
        theirs = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(theirs, "cluster_site.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def client(
    network: Network,
    head: Head,
    scratch: Path,
    scenarios: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 1500,
) -> list[dict[str, Any]]:
    """Run the client script in the namespace; its RESULT lines' JSON (it must succeed)."""
    laptop, extra = scratch / "laptop", scratch / "laptop_env"
    if not laptop.exists():
        shutil.copytree(TESTS / "laptop", laptop)  # the user's package: only the client's path has it
        shutil.copytree(TESTS / "laptop_env", extra)  # its own other package, and a pip requirement "installed"
    variables = {
        **clean_env(),
        **S3_ENV,
        "RAY_AUTH_TOKEN": head.token,
        "RAYMODEL_HOME": head.home,
        "PYTHONPATH": os.pathsep.join(map(str, (laptop, extra, extra / "site", TESTS))),
        "RM_TEST_LAPTOP_ENV": str(extra),
        "RM_TEST_CLUSTER": head.address,
        "RM_TEST_SERVE_PORT": str(head.serve_port),
        "RM_TEST_DASHBOARD_PORT": str(head.web_port),
        **(env or {}),
    }
    out = subprocess.run(
        ["ip", "netns", "exec", network.name, sys.executable, str(TESTS / "off_cluster_client.py"), *scenarios],
        env=variables,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=scratch,
    )
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]


def run(scratch: Path, scenarios: list[str]) -> list[dict[str, Any]]:
    """A network, an S3 server and a head on it, and the client's scenarios; the RESULT lines."""
    with Network() as network, S3Server(host=network.host) as s3:
        with Head(network.host, scratch, s3) as head:
            started = time.monotonic()
            results = client(network, head, scratch, scenarios)
            return [*results, {"scenario": "took", "s": time.monotonic() - started}]


if __name__ == "__main__":
    for row in run(Path(sys.argv[1]), sys.argv[2:]):
        print("RESULT " + json.dumps(row), flush=True)
