"""Starting or joining Ray, quietly, and where raymodel keeps its files."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

from raymodel.exceptions import SettingsError

_QUIET_LOGGERS = ("ray", "ray.train", "ray.tune", "ray.serve", "ray.data")


def _has_token() -> bool:
    return bool(
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or (Path.home() / ".ray" / "auth_token").exists()
    )


# Ray's token auth stays on. A client sends its token only in token mode, which Ray turns on by
# itself for the instances it starts; a process that joins a cluster started with `ray start`
# (`raymodel server start`) must say so before Ray is imported (Ray reads the mode once; once
# imported, it is left as Ray decided, which is consistent).
if "RAY_AUTH_MODE" not in os.environ and "ray" not in sys.modules and _has_token():
    os.environ["RAY_AUTH_MODE"] = "token"


def home() -> str:
    """``RAYMODEL_HOME`` (default ``~/.raymodel``): run outputs and the registry.

    A local path is made absolute; a URI (``s3://...``) is returned as is.
    """
    value = os.environ.get("RAYMODEL_HOME") or "~/.raymodel"
    if "://" in value:
        return value.rstrip("/")
    return str(Path(value).expanduser().resolve())


def home_path(*names: str) -> str:
    """A location under ``RAYMODEL_HOME`` (a URI keeps its scheme and query)."""
    from raymodel._internal import storage

    return storage.join(home(), *names)


def runs_root() -> str:
    root = home()
    if "://" in root:
        return home_path("runs")
    path = Path(root) / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def server_file() -> Path:
    return Path(os.environ.get("RAYMODEL_SERVER_FILE") or Path.home() / ".raymodel" / "server.json")


def running_server() -> dict[str, Any] | None:
    """What ``raymodel server start`` wrote, if that head is still up."""
    try:
        info = json.loads(server_file().read_text())
    except (OSError, ValueError):
        return None
    return info if _alive(info.get("gcs_pid", -1)) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return pid > 0
    except (ProcessLookupError, PermissionError, OverflowError):
        return False


def run_name(prefix: str) -> str:
    """A unique, readable run name: ``DigitsNet-2026-11-21_12-05-10-4f3a``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", prefix)
    return f"{safe}-{time.strftime('%Y-%m-%d_%H-%M-%S')}-{os.urandom(2).hex()}"


SERVE_INGRESSES = ("haproxy", "proxy")


def resolve_ingress(choice: str | None = None) -> str:
    """The Serve ingress a Ray instance started by raymodel gets: ``choice``, else
    ``RAYMODEL_SERVE_INGRESS``, else ``"haproxy"``; a bad name is a ``SettingsError``."""
    from raymodel.exceptions import SettingsError

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
    the replica's own: ``serve._deployment.BatchRunner``)."""
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


#: The training server's actor name and Ray namespace (one server per cluster).
SERVER_NAME, SERVER_NAMESPACE = "raymodel-job-server", "raymodel"
#: A job that is not done, and the states a job ends in.
JOB_ACTIVE, JOB_DONE = ("PENDING", "RUNNING"), ("SUCCEEDED", "FAILED", "STOPPED")


def job_server() -> Any:
    """The running training server's actor handle, or ``None`` (``raymodel.jobs.server`` starts one)."""
    import ray

    try:
        return ray.get_actor(SERVER_NAME, namespace=SERVER_NAMESPACE)
    except ValueError:
        return None


def on_this_node() -> Any:
    """A scheduling strategy for a resource-free helper actor (the job server, a job's runner, a pool, a
    hub): this process's node (as Ray Train places a run's controller), not a worker node whose loss
    would take it along. Hard: Ray's soft affinity passes over a node without CPUs (a head kept free
    of work), where these belong most."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def pool_idle_s() -> float:
    """How long an idle pool of the training server lives (``rm.init(pool_idle_s=...)``; default 120 s)."""
    return float(os.environ.get("RAYMODEL_POOL_IDLE_S", "120"))


def make_room(needs: dict[str, float] | None = None) -> None:
    """Before raymodel takes resources for other work (a route, ``predict_batch``, a Tune run, a one-off
    training run): the training server ends its idle pools that stand in the way, and this returns once
    their resources are back. ``needs=None``: every idle pool. Nothing happens without a server."""
    import ray

    server = job_server()
    if server is not None:
        ray.get(server.make_room.remote(needs))


def init(
    address: str | None = None,
    *,
    verbose: bool = False,
    serve_ingress: str | None = None,
    pool_idle_s: float | None = None,
    **ray_init_kwargs: Any,
) -> None:
    """Start a local Ray instance, or join a cluster, unless Ray is already running.

    ``RAY_ADDRESS`` (or ``address=``) joins a cluster, as does a running
    ``raymodel server start``; otherwise a local instance is started (the
    dashboard stays on: Train V2 needs its state API).
    With ``verbose=False`` Ray's own log lines are hidden on the driver.

    Args:
        address: A Ray cluster address, e.g. ``"ray://head:10001"`` or ``"auto"``.
        verbose: Show Ray's internal logs and worker output on the driver.
        serve_ingress: How HTTP reaches a served model on an instance started here:
            ``"haproxy"`` (default, or ``RAYMODEL_SERVE_INGRESS``) or ``"proxy"``
            (Serve's Python proxy). A cluster joined keeps what it was started with.
        pool_idle_s: How long an idle pool (a resident worker group of the
            training server) lives before it ends and gives its resources back
            (default 120 s; also ``RAYMODEL_POOL_IDLE_S``).
        **ray_init_kwargs: Passed to ``ray.init`` (e.g. ``num_cpus=2``).

    Example:
        >>> import raymodel as rm
        >>> rm.init(num_cpus=2)
    """
    import ray

    quiet(verbose)
    ingress = resolve_ingress(serve_ingress)  # a bad name fails before Ray starts
    if pool_idle_s is not None:
        if isinstance(pool_idle_s, bool) or not isinstance(pool_idle_s, (int, float)) or pool_idle_s < 0:
            raise SettingsError(f"`pool_idle_s` must be a number of seconds >= 0 (got {pool_idle_s!r}).")
        os.environ["RAYMODEL_POOL_IDLE_S"] = str(float(pool_idle_s))
    if ray.is_initialized():
        _tell_server_idle_s(pool_idle_s)
        return
    # Train V2's controller collects each `ray.train.report` when it polls the
    # workers (every 2 s by default), and a worker's next report waits for
    # that: 2 s per epoch. A local instance started here polls every 0.2 s;
    # set the variable yourself to choose another interval.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    kwargs: dict[str, Any] = {
        "log_to_driver": verbose,
        "logging_level": logging.INFO if verbose else logging.ERROR,
        "configure_logging": True,
    }
    if address is None and not os.environ.get("RAY_ADDRESS") and not ray_init_kwargs:
        address = (running_server() or {}).get("address")  # `raymodel server start` is running: join it
    if address is not None:
        kwargs["address"] = address
    elif not os.environ.get("RAY_ADDRESS"):
        os.environ.update(with_serve_env(os.environ, ingress))  # a new local instance: its Serve reads them
        # Train V2 starts a preemption watcher actor with every worker group, to notice a node that the
        # autoscaler drains. A local instance is one machine that nothing drains: the watcher would only
        # cost a process start (about 3 s of CPU on 2 cores) per run and per restart.
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

    kwargs.update(ray_init_kwargs)
    ray.init(**kwargs)
    quiet(verbose)
    _tell_server_idle_s(pool_idle_s)


def _tell_server_idle_s(seconds: float | None) -> None:
    """A training server already running (a joined cluster's) takes the new ``pool_idle_s``."""
    if seconds is None:
        return
    import ray

    server = job_server()
    if server is not None:
        ray.get(server.set_pool_idle_s.remote(float(seconds)))


class _BelowWarning(logging.Filter):
    """Drops a logger's INFO lines while raymodel is quiet: Ray Serve resets its logger's level
    when it starts (and logs "Started Serve ..." right then), but keeps the logger's filters."""

    active = True

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.active or record.levelno >= logging.WARNING


_FILTER = _BelowWarning()


def quiet(verbose: bool) -> None:
    """Hide (or show again) Ray's driver-side logging and progress reporters."""
    level = logging.INFO if verbose else logging.WARNING
    _FILTER.active = not verbose
    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    if not verbose:
        # Tune's console reporter and Ray's deprecation chatter. (Tune's JSON/CSV trial
        # loggers stay on: its ResultGrid reads them.)
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        warnings.filterwarnings("ignore", module=r"ray(\.|$)")


def ensure_ray(verbose: bool = False) -> None:
    import ray

    if not ray.is_initialized():
        init(verbose=verbose)
    else:
        quiet(verbose)


def set_threads(cpus: float) -> int:
    """Torch's intra-op threads for an actor's CPU share (``ceil``, at least 1), not the whole node's:
    two replicas of 1 CPU on a 2-core node would otherwise each start 2 threads and fight."""
    threads = max(1, math.ceil(cpus))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    return threads
