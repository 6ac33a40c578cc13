"""How HTTP reaches a served model on a Ray instance raymodel starts: Serve's HAProxy ingress or its
Python proxy, and the environment Serve's processes read for it."""

from __future__ import annotations

import os
from typing import Mapping

from raymodel.exceptions import SettingsError

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


def serve_env(ingress: str) -> dict[str, str]:
    """The environment Ray Serve reads when its processes start, for ``ingress`` (docs/performance.md: "Where the
    time goes"). ``"haproxy"``: Serve's HAProxy listens on the HTTP port and forwards each request
    straight to a replica's own HTTP server (no Python proxy, no actor call); ``"proxy"``: Serve's
    Python proxy actor, one actor call per request. Both run the replica's code on its main event
    loop (one thread hop less per request; a model whose batches take long runs them on a thread of
    the replica's own: ``serve._batching.BatchRunner``)."""
    env = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
    if ingress != "haproxy":
        return env
    # HAProxy's stats and metrics ports are per instance, so that two Ray instances on one machine (a
    # test session and a demo it runs) do not fight over Ray's fixed defaults (its files are per node).
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
            "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port()),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port()),
        }
    )
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_serve_env(environ: Mapping[str, str], ingress: str) -> dict[str, str]:
    """``environ`` plus ``serve_env(ingress)``, for a Ray instance about to be started from it (each
    of its workers inherits it). A variable the user set stays as it is; ones that a raymodel parent
    process set for *its* instance (marked with its pid) are replaced."""
    env = dict(environ)
    mark = env.get("RAYMODEL_SERVE_ENV_PID")
    inherited = mark is not None and mark != str(os.getpid())
    for name, value in serve_env(ingress).items():
        if inherited or name not in env:
            env[name] = value
    env["RAYMODEL_SERVE_ENV_PID"] = str(os.getpid())
    return env
