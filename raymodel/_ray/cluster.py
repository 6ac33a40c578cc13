"""Starting or joining Ray, quietly: the one way raymodel attaches a process to a cluster, the
head that ``raymodel server start`` leaves running, and where helper actors are placed."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator, MutableMapping

from raymodel._ray.ingress import end_haproxy, resolve_ingress, with_serve_env
from raymodel._ray.ray_start import dashboard_beside_raylet
from raymodel.exceptions import RayModelError

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


def server_file() -> Path:
    return Path(os.environ.get("RAYMODEL_SERVER_FILE") or Path.home() / ".raymodel" / "server.json")


def running_server() -> dict[str, Any] | None:
    """What ``raymodel server start`` wrote, if that head is still up."""
    try:
        info = json.loads(server_file().read_text())
    except (OSError, ValueError):
        return None
    return info if _alive(info.get("gcs_pid", -1)) else None


def head_problem(info: dict[str, Any]) -> str | None:
    """Why the head of ``running_server``'s ``info`` cannot take work, if it cannot: its GCS runs but its
    raylet ended (killed, or out of memory). No process can join such a head: ``ray.init`` tries for a
    minute, then names an address of the machine's own."""
    raylet = info.get("raylet_pid")
    if raylet is None or _alive(raylet):  # a file of an older raymodel names no raylet
        return None
    return (
        f"The raymodel server at {info['address']} cannot take work: its raylet (pid {raylet}) has ended while "
        f"its GCS (pid {info['gcs_pid']}) runs. `raymodel server stop` ends what is left of it; then "
        "`raymodel server start`."
    )


def joinable_server() -> dict[str, Any] | None:
    """``running_server()``, or a ``RayModelError`` saying why its head cannot take work (at once)."""
    info = running_server()
    problem = None if info is None else head_problem(info)
    if problem:
        raise RayModelError(problem)
    return info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OverflowError):
        return False
    try:  # a killed daemon whose parent (`ray start`) is gone may stay a zombie: ended, not reaped
        return pid > 0 and Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS)
        return pid > 0


def on_this_node() -> Any:
    """A scheduling strategy for a resource-free helper actor (the job server, a job's runner, a pool, a
    hub): this process's node (as Ray Train places a run's controller), not a worker node whose loss
    would take it along. Hard: Ray's soft affinity passes over a node without CPUs (a head kept free
    of work), where these belong most."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def init(
    address: str | None = None,
    *,
    verbose: bool = False,
    serve_ingress: str | None = None,
    **ray_init_kwargs: Any,
) -> bool:
    """Start a local Ray instance, or join a cluster, unless Ray is already running: ``rm.init``
    (``raymodel.jobs.init``) without the training server's settings; its docstring says what each
    argument does. A local instance started here keeps Ray's dashboard (Train V2 needs its state API),
    started beside its raylet rather than before it (``ray_start``).
    Returns whether it started a local instance."""
    import ray

    quiet(verbose)
    ingress = resolve_ingress(serve_ingress)  # a bad name fails before Ray starts
    if ray.is_initialized():
        return False
    # Train's report poll (``_RAY_DEFAULTS``) in this process too, whatever the cluster: Train passes it
    # from the process that calls ``fit`` to the run's controller.
    os.environ.setdefault(*_RAY_DEFAULTS[0])
    kwargs: dict[str, Any] = {
        "log_to_driver": verbose,
        "logging_level": logging.INFO if verbose else logging.ERROR,
        "configure_logging": True,
    }
    if address is None and not os.environ.get("RAY_ADDRESS") and not ray_init_kwargs:
        address = (joinable_server() or {}).get("address")  # `raymodel server start` is running: join it
    if address == "local" or (address is None and not os.environ.get("RAY_ADDRESS")):
        # A new local instance, said so to Ray: given no address, `ray.init` would join the cluster
        # named in /tmp/ray/ray_current_cluster (the last `ray start`, or any `ray.cluster_utils.Cluster`
        # on the machine) and refuse `num_cpus` there.
        kwargs["address"] = "local"
        end_haproxy()  # what Ray instances that died left of their HTTP ingress (raymodel/_ray/ingress.py)
        os.environ.update(with_serve_env(os.environ, ingress))  # a new local instance: its Serve reads them
        ray_defaults(os.environ)  # a new local instance: its processes inherit them
        kwargs["dashboard_port"] = own_api_server(os.environ, ray_init_kwargs.get("dashboard_port"))
    elif address is not None:
        kwargs["address"] = address
        if "RAY_AUTH_MODE" not in os.environ and _has_token():
            # Ray was imported before raymodel (the mode is read once, at import) and, given an address,
            # does not turn token mode on by itself: it would be refused by the cluster (a raw
            # ConnectionError). Ray's own step for an address it finds (without its log line), done here.
            from ray._private.authentication.authentication_token_setup import _enable_token_auth

            _enable_token_auth()

    kwargs.update(ray_init_kwargs)
    local = kwargs.get("address") == "local"
    with dashboard_beside_raylet() if local else contextlib.nullcontext():
        ray.init(**kwargs)
    quiet(verbose)
    if ray_init_kwargs.get("runtime_env"):  # the jobs this process submits carry it (as uploaded: URIs)
        from raymodel._ray import remote

        os.environ[remote.JOB_ENV] = json.dumps(dict(ray.get_runtime_context().runtime_env), sort_keys=True)
    _EXIT.logs_to_driver = bool(kwargs["log_to_driver"])
    if not _EXIT.registered:  # after Ray's own hook (registered at its import): atexit runs this first
        atexit.register(_exit_quickly)
        _EXIT.registered = True
    return local


class _Exit:
    registered = False
    logs_to_driver = False


_EXIT = _Exit()


def _exit_quickly() -> None:
    """At the interpreter's exit of a process that ``init`` attached: leave Ray, then freeze what is left.

    Ray's own exit hook waits 0.5 s for its workers' log lines before it disconnects; a process that asked
    for none (``log_to_driver`` off: raymodel's default) disconnects at once. And the interpreter's final
    garbage collections walk every object still alive (torch's, the user's data): frozen, they are left to
    the process's end, as Python allows (``__del__`` is not promised at exit; ``atexit`` hooks and
    ``weakref.finalize`` still run). docs/performance.md has what this saves a process's exit.

    A process that started its own instance ends that instance's autoscaler monitor first (``_end_monitor``)."""
    import ray

    _end_monitor()
    if ray.is_initialized() and not _EXIT.logs_to_driver:
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - Ray's own exit hook, which runs next, tries again
            pass
    gc.freeze()


def _end_monitor() -> None:
    """End the autoscaler monitor of the Ray instance this process started (none of a cluster joined).

    Ray's shutdown ends its processes one at a time, the GCS before the monitor, and gives each a second
    after SIGTERM; the monitor's SIGTERM handler writes an "autoscaler failed" error to the GCS and
    publishes it to the drivers, and with the GCS gone it waits out that second, then is killed. A local
    instance's monitor has no nodes to launch or end: killed first, it costs nothing, and the shutdown
    does not wait out that second."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    if node is None:
        return
    try:
        node.kill_monitor(check_alive=False)  # SIGKILL, then reaped; a joined process's node has none
    except Exception:  # noqa: BLE001 - Ray's shutdown ends it then, after its wait
        pass


#: Where Ray's state API clients send their queries when given no address (``ray.util.state``).
API_SERVER = "RAY_API_SERVER_ADDRESS"
_OWN_API_SERVER = "RAYMODEL_API_SERVER_PID"


def own_api_server(environ: Any, dashboard_port: int | None = None) -> int:
    """Choose the dashboard's port of a Ray instance about to start from ``environ`` (a free one, unless
    given), and point ``RAY_API_SERVER_ADDRESS`` there; every process of the instance inherits it.

    Without it, a state API query made without an address (Ray Train V2's placement group cleaner asks
    it whether a run's controller is alive) finds *a* Ray instance of the machine, the newest: with two
    on one machine, one's cleaner was told another's controller is dead and removed a live worker
    group. A variable the user set stays; one a raymodel process set for its own instance is replaced."""
    from raymodel._ray.ingress import free_port

    port = int(dashboard_port) if dashboard_port is not None else free_port()
    if API_SERVER not in environ or environ.get(_OWN_API_SERVER) is not None:
        environ[API_SERVER] = f"http://127.0.0.1:{port}"
        environ[_OWN_API_SERVER] = str(os.getpid())
    return port


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
    """Ray in this process: joined or started as ``rm.init`` does, unless it runs already. A client off
    the cluster (``rm.init(address="http://...")``) starts none: what needs Ray here is refused."""
    import ray

    from raymodel._ray import remote

    cluster = remote.active()
    if cluster is not None:
        raise RayModelError(
            f"This process is a client of the cluster at {cluster.address}, off it: it starts no Ray, and this "
            "call is not one that a client off the cluster makes yet (train, tune, release, jobs, serving and the "
            "registry are). "
            "Run it on a node of the cluster, or as a job there (`ray job submit`)."
        )
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


#: Ray Train V2's and Ray Data's settings on a Ray instance that raymodel starts (``rm.init``'s local one,
#: ``raymodel server start``'s head), each unless set:
#: - Train's controller collects each worker's report when it polls (every 2 s by default), and a worker's
#:   next report can wait for that: the runs poll every 0.2 s;
#: - Train starts a preemption watcher actor with every worker group, to notice a node that an autoscaler
#:   drains; such an instance runs no autoscaler, so the watcher would only cost a process start (about
#:   3 s of CPU on 2 cores) per run and per restart;
#: - Ray Data reads the footers of Parquet files (``predict_batch`` of a folder, ``raymodel predict``) on a
#:   pool of 32 actors, made for a cluster's network reads, each a process of its own (about 1.5 s of
#:   CPU here, per read: 64 in a suite run); on one machine 2 actors, each with 128 reads in flight.
_RAY_DEFAULTS = (
    ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2"),
    ("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0"),
    ("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "2"),
)


def ray_defaults(env: MutableMapping[str, str]) -> None:
    """Put ``_RAY_DEFAULTS`` into ``env`` (the environment a new Ray instance starts with), each unless set."""
    for name, value in _RAY_DEFAULTS:
        env.setdefault(name, value)


#: Ray Train reads how long a worker group may take to start from the environment of the process that
#: calls ``fit`` (and hands it to the run's controller).
_START_TIMEOUT = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"


@contextlib.contextmanager
def worker_group_start_timeout(seconds: float | None) -> Iterator[None]:
    """Ray Train's worker-group start timeout for the runs started in this block (an elastic run's
    ``elastic_wait_s``); ``None``, or a value the user set in Ray's environment, leaves it alone."""
    if seconds is None or _START_TIMEOUT in os.environ:
        yield
        return
    os.environ[_START_TIMEOUT] = f"{seconds:g}"
    try:
        yield
    finally:
        os.environ.pop(_START_TIMEOUT, None)
