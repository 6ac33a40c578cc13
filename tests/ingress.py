"""The HTTP ingress (Serve's HAProxy) of a ``raymodel server start`` head, in a process of its own;
tests/test_serve_env.py runs it: serve -> what HAProxy listens on -> ``server stop`` (no HAProxy
left, the port free) -> ``server start`` -> serve again on the same port. Prints ``RESULT`` JSON."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from models import DigitsNet
from s3server import free_port

import raymodel as rm
from raymodel._ray.ingress import haproxy_processes, who_listens

CLI = [sys.executable, "-m", "raymodel.cli"]


def cli(*args: str) -> str:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def listening(pids: set[int]) -> list[str]:
    """``host:port`` of every TCP socket the processes ``pids`` listen on."""
    inodes = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":
            hex_ip, hex_port = fields[1].split(":")
            ip = ".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0))
            inodes[f"socket:[{fields[9]}]"] = f"{ip}:{int(hex_port, 16)}"
    out = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # it ended meanwhile
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target in inodes:
                out.add(inodes[target])
    return sorted(out)


def serve_once(port: int) -> dict:
    import ray
    import requests

    rm.init()  # attaches to `raymodel server start`
    model = DigitsNet(config={"seed": 0})
    model.ensure_setup()
    rm.registry.put(model, "digits", alias="production")
    served = rm.Servable("digits@production", "/ing", settings={"port": port, "ray_actor_options": {"num_cpus": 0.25}})
    url = served.deploy().url
    answer = requests.post(url, json={"pixels": [[0.0] * 64]}, timeout=30)
    server = json.loads(Path(os.environ["RAYMODEL_SERVER_FILE"]).read_text())
    folder = server["haproxy_dir"]
    # Serve reloads HAProxy when a route changes: the process it replaces lingers a moment with its
    # listeners closed. Read the processes and their sockets until the new one answers for them. Serve
    # also writes each new config before it runs the HAProxy (raymodel's script) that rewrites and reads
    # it: a config read between the two still says Ray's `mode 666` (clean-clone run 44). Read it until it
    # is the one HAProxy runs with; the admin socket's own mode says what HAProxy made of it.
    deadline = time.monotonic() + 30
    while True:
        pids = set(haproxy_processes(folder))
        sockets = listening(pids)
        config = next(Path(folder).glob("*/haproxy.cfg")).read_text()
        rewritten = " mode 666 " not in config
        if sockets and rewritten or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    socket_modes = [oct(stat.S_IMODE(os.stat(path).st_mode)) for path in Path(folder).glob("*/admin.sock")]
    ray.shutdown()
    return {
        "status": answer.status_code,
        "url": url,
        "folder": folder,
        "folder_mode": oct(stat.S_IMODE(os.stat(Path(folder).parent).st_mode)),
        "haproxy": sorted(pids),
        "listening": sockets,
        "stats_socket": [line.strip() for line in config.splitlines() if "stats socket" in line],
        "socket_modes": socket_modes,
        # Serve's fallback proxy: where HAProxy sends the requests of a replica it marked down
        "fallback": [line.strip() for line in config.splitlines() if line.strip().endswith(" check backup")],
    }


def main() -> None:
    ports = [str(free_port()), str(free_port())]
    http = free_port()
    cli("server", "start", "--port", ports[0], "--dashboard-port", ports[1], "--num-cpus", "2")
    first = serve_once(http)
    cli("server", "stop")
    time.sleep(1)
    after = {"haproxy": sorted(haproxy_processes(first["folder"])), "port": who_listens(http)}
    cli("server", "start", "--port", ports[0], "--dashboard-port", ports[1], "--num-cpus", "2")
    try:
        again = serve_once(http)
    finally:
        cli("server", "stop")
    print("RESULT " + json.dumps({"http": http, "first": first, "after_stop": after, "again": again}), flush=True)


if __name__ == "__main__":
    main()
