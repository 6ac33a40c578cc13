"""The dashboard: jobs with live learning curves, a tune job's trials, the registry, served routes
and the cluster's resources, in one web page on 127.0.0.1.

    url = rm.dashboard()              # in this process, in the background; returns the URL (with its token)
    $ raymodel dashboard [--port 8270] [--host 127.0.0.1]

It reads the job server's records, Ray's state API, the registry and Ray
Serve; it loads nothing from the internet (the charts are SVG the page
draws). It is read-only except for stopping a job, which needs the token
printed with the URL.
"""

from __future__ import annotations

import atexit
import secrets
import socket
import threading
import time
from typing import Any

from raymodel.exceptions import SettingsError

__all__ = ["dashboard", "run"]

DEFAULT_PORT = 8270
_running: dict[tuple[str, int], str] = {}
_lock = threading.Lock()
#: The servers this process runs, each with its thread: stopped at the interpreter's exit (``_stop``).
_threads: list[tuple[Any, threading.Thread]] = []
#: How long the exit waits for a server to close its connections and its event loop.
_STOP_S = 5.0


def dashboard(port: int = DEFAULT_PORT, host: str = "127.0.0.1", token: str | None = None) -> str:
    """Start the dashboard in this process (a background thread) and return its URL.

    The URL carries the token (``?token=...``) that the page needs to stop a
    job; keep it to yourself. Calling it again for the same host and port
    returns the same URL. Binds ``host`` only (127.0.0.1 unless you ask).

    Off the cluster (``rm.init(address="http://HEAD:8265")``) the dashboard runs on the cluster's head
    instead, on every address of the head (``host`` is not used), until the cluster ends; the URL is
    at the head's address.

    Raises:
        SettingsError: ``port`` or ``host`` is not usable (e.g. the port is taken).
    """
    from raymodel._ray import cluster, remote

    if remote.active() is not None:
        return _on_the_head(port)
    with _lock:
        if (host, port) in _running:
            return _running[(host, port)]
        token = token or secrets.token_urlsafe(16)
        server = _server(host, port, token)
        cluster.ensure_ray(False)
        thread = threading.Thread(target=server.run, name="raymodel-dashboard", daemon=True)
        if not _threads:
            atexit.register(_stop)
        _threads.append((server, thread))
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise SettingsError(f"The dashboard could not start on {host}:{port}.")
            time.sleep(0.05)
        url = _url(host, port, token)
        _running[(host, port)] = url
        return url


def run(port: int = DEFAULT_PORT, host: str = "127.0.0.1") -> None:
    """``raymodel dashboard``: serve until interrupted (the URL is printed once it answers)."""
    url = dashboard(port, host)
    print(
        f"raymodel dashboard: {url}\n"
        f"  (the token in the URL is needed to stop jobs; the rest is read-only. Ctrl-C ends it.)",
        flush=True,
    )
    while True:
        time.sleep(3600)


def _on_the_head(port: int) -> str:
    """Off the cluster: the dashboard's URL on the cluster's head, at the head's address."""
    from urllib.parse import urlsplit

    from raymodel._ray import remote

    cluster = remote.active()
    assert cluster is not None
    url = remote.call(_start_on_head, port)
    return url.replace("//127.0.0.1:", f"//{urlsplit(cluster.address).hostname}:", 1)


def _start_on_head(port: int) -> str:
    """On the cluster (a call's driver, which runs on the head): the dashboard in a detached actor of
    the head's, started unless one runs on ``port``; its URL."""
    import ray

    from raymodel._ray import cluster

    actor = ray.remote(num_cpus=0)(_OnTheHead).options(
        name=f"raymodel-dashboard-{port}",
        namespace="raymodel",
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=cluster.on_this_node(),
    )
    return str(ray.get(actor.remote(port).url.remote()))  # type: ignore[attr-defined]


class _OnTheHead:
    """The dashboard in an actor of the head's, on all its addresses."""

    def __init__(self, port: int) -> None:
        self._url = dashboard(port, "0.0.0.0")

    def url(self) -> str:
        return self._url


def _server(host: str, port: int, token: str) -> Any:
    """A uvicorn server for the app, once ``host:port`` is checked free (a clear error, not a log line)."""
    import uvicorn

    from raymodel.web._app import create_app

    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise SettingsError(f"`port` must be an integer from 1 to 65535 (got {port!r}).")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SettingsError(
                f"The dashboard cannot listen on {host}:{port}: {exc.strerror or exc}. "
                f"Pass another port (`--port` / `port=`)."
            ) from exc
    config = uvicorn.Config(
        create_app(token),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,  # the exit does not wait on a page that keeps a request open
    )
    return uvicorn.Server(config)  # in a background thread it leaves signals alone


def _stop() -> None:
    """At the interpreter's exit: end each server's loop and wait for its thread. A daemon thread left
    running its event loop (uvloop) would fire a timer after the interpreter was torn down, and the
    process would end in a segmentation fault instead of its own exit status."""
    for server, _ in _threads:
        server.should_exit = True
    deadline = time.monotonic() + _STOP_S
    for _, thread in _threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _url(host: str, port: int, token: str) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}/?token={token}"
