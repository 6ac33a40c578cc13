"""The one client of the training server: the only code that knows the server actor's name, starts it,
and follows a job to its end.

Everything that talks to the server goes through here: the public ``raymodel.jobs`` functions, the
``Job`` handles, the pools and runners inside the server, and, through the ``TrainingServer`` port of
``raymodel.contract`` that ``ServerClient`` fills, the drivers below ``raymodel.jobs`` (room before a
route or a run takes resources; a Tune trial's job on a pool).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from raymodel._ray import cluster
from raymodel.exceptions import SettingsError
from raymodel.jobs._address import NAME, NAMESPACE, find, running_handle
from raymodel.jobs._constants import DEFAULT_POOL_IDLE_S, DONE
from raymodel.jobs._warm import parse_warm

__all__ = ["NAME", "NAMESPACE", "running_handle", "server_handle", "call", "init", "follow", "pool_idle_s"]


class RemoteServer:
    """The training server of a cluster this process is not a node of (``_ray/remote.py``): each
    of its methods called is one call of the cluster's, which starts the server there if none runs."""

    def call(self, method: str, *args: Any) -> Any:
        from raymodel._ray import remote

        return remote.call(_on_the_server, method, args)

    def __repr__(self) -> str:
        from raymodel._ray import remote

        cluster = remote.active()
        return f"RemoteServer({cluster.address if cluster else None!r})"


def _on_the_server(method: str, args: tuple[Any, ...]) -> Any:
    """On the cluster: ``server.<method>(*args)`` of the training server there."""
    return call(server_handle(), method, *args)


def call(handle: Any, method: str, *args: Any) -> Any:
    """``server.<method>(*args)``, waited for: on the server's actor (``handle``), or as a call of the
    cluster's where ``handle`` is a ``RemoteServer``."""
    if isinstance(handle, RemoteServer):
        return handle.call(method, *args)
    import ray

    return ray.get(getattr(handle, method).remote(*args))


def pool_idle_s() -> float:
    """How long an idle pool of the training server lives (``rm.init(pool_idle_s=...)``; default 120 s)."""
    return float(os.environ.get("RAYMODEL_POOL_IDLE_S", str(DEFAULT_POOL_IDLE_S)))


def server_handle(start: bool = True) -> Any:
    """The training server's actor handle: the running one, or one started now (detached, on this
    node); ``None`` with ``start=False`` when none runs. Off the cluster, a ``RemoteServer``."""
    from raymodel._ray import remote

    if remote.active() is not None:
        return RemoteServer()
    cluster.ensure_ray(False)
    running = find()
    if running is not None or not start:
        return running
    from raymodel.jobs._server.actor import JobServerActor

    return JobServerActor.options(
        name=NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_concurrency=256,
        scheduling_strategy=cluster.on_this_node(),
    ).remote(_home(), pool_idle_s(), prune_limits())


def prune_limits() -> dict[str, float]:
    """What the server keeps on disk (``RAYMODEL_PRUNE_AFTER_S``, ``RAYMODEL_PRUNE_MAX_MB``): see
    ``jobs/_prune.py``."""
    from raymodel.jobs._prune import limits_from_env

    return limits_from_env()


def _home() -> str:
    from raymodel._internal import locations

    return locations.home()


def init(
    address: str | None = None,
    *,
    verbose: bool = False,
    serve_ingress: str | None = None,
    pool_idle_s: float | None = None,
    warm: str | Sequence[tuple[str, int]] | None = None,
    **ray_init_kwargs: Any,
) -> None:
    """Start a local Ray instance, or join a cluster, unless Ray is already running.

    ``RAY_ADDRESS`` (or ``address=``) joins a cluster, as does a running
    ``raymodel server start``; otherwise a local instance is started (the
    dashboard stays on: Train V2 needs its state API), never the cluster a
    ``ray start`` left in ``/tmp/ray/ray_current_cluster`` (name it to join it).
    With ``verbose=False`` Ray's own log lines are hidden on the driver.

    At the process's exit, a process attached here leaves Ray without Ray's
    0.5 s wait for its workers' log lines (unless ``verbose``: it asked for
    them) and freezes its objects, so that Python's last garbage collections
    do not walk them (``__del__`` is not promised at exit; ``atexit`` hooks
    and ``weakref.finalize`` still run). A process that started its own
    instance ends that instance's autoscaler monitor before Ray's shutdown,
    which would give it a second to end (it reports to the GCS, ended first).

    Args:
        address: A Ray cluster address: ``"HEAD:6379"`` or ``"auto"`` from a node of the
            cluster; ``"http://HEAD:8265"`` (the head's dashboard) from a machine that is not
            one: this process then starts no Ray and each call is a job of Ray's Jobs API
            there (docs/storage.md, "From a laptop"; ``runtime_env`` is the calls' there).
        verbose: Show Ray's internal logs and worker output on the driver.
        serve_ingress: How HTTP reaches a served model on an instance started here:
            ``"haproxy"`` (default, or ``RAYMODEL_SERVE_INGRESS``) or ``"proxy"``
            (Serve's Python proxy). A cluster joined keeps what it was started with.
        pool_idle_s: How long an idle pool (a resident worker group of the
            training server) lives before it ends and gives its resources back
            (default 120 s; also ``RAYMODEL_POOL_IDLE_S``). A server already
            running takes the new value.
        warm: Pools the training server starts at once, in the background, and
            keeps warm, so that a first job finds its workers started:
            ``"torch:2"``, ``"torch:2,lightning:1"``, ``[("torch", 2)]``,
            ``"none"``, or ``"auto"``: 2 workers for the backend of each model
            class this process has defined (torch's where none), and 1 worker
            of each too where the CPUs hold both sizes. ``"rllib"``
            (no pool, by name alone): the Algorithm's actor started ahead. A job
            with that backend and ``num_workers`` (default placement) takes the
            pool, ready or still starting; a pool of torch's takes Lightning
            and transformers jobs too (one kind of worker group). Default: ``RAYMODEL_WARM``, else
            ``"auto"`` for a local instance started here; a cluster joined
            keeps what its server was given.
        **ray_init_kwargs: Passed to ``ray.init`` (e.g. ``num_cpus=2``).

    Example:
        >>> import raymodel as rm
        >>> rm.init(num_cpus=2)
    """
    if pool_idle_s is not None:
        if isinstance(pool_idle_s, bool) or not isinstance(pool_idle_s, (int, float)) or pool_idle_s < 0:
            raise SettingsError(f"`pool_idle_s` must be a number of seconds >= 0 (got {pool_idle_s!r}).")
        os.environ["RAYMODEL_POOL_IDLE_S"] = str(float(pool_idle_s))
    if warm is not None:
        parse_warm(warm, cpus=1.0)  # a bad value fails before Ray starts
    from raymodel._ray import remote

    if remote.is_dashboard_address(address if address is not None else os.environ.get("RAY_ADDRESS")):
        _init_off_cluster(address or os.environ["RAY_ADDRESS"], pool_idle_s, warm, ray_init_kwargs)
        return
    local = cluster.init(address, verbose=verbose, serve_ingress=serve_ingress, **ray_init_kwargs)
    import ray

    if pool_idle_s is not None:
        server = running_handle()
        if server is not None:
            ray.get(server.set_pool_idle_s.remote(float(pool_idle_s)))
    if warm is not None or local:
        specs = parse_warm(warm, cpus=float(ray.cluster_resources().get("CPU", 0.0)))
        if specs or warm is not None:
            server_handle().warm.remote(list(specs))  # the server starts them; nothing here waits


def _init_off_cluster(address: str, pool_idle_s: float | None, warm: Any, ray_init_kwargs: dict[str, Any]) -> None:
    """``rm.init(address="http://HEAD:8265")``: a client of that cluster, which runs no Ray here."""
    from raymodel._ray import remote

    runtime_env = ray_init_kwargs.pop("runtime_env", None)
    if ray_init_kwargs:
        raise SettingsError(
            f"{sorted(ray_init_kwargs)} start or shape a Ray instance here; a client of the cluster at {address} "
            "starts none (the cluster keeps its own settings). Leave them out."
        )
    remote.connect(address, runtime_env)
    if runtime_env:  # the server, where this call starts it, without them: its jobs each carry their own
        remote.call(_server_up, bare=True)
    if pool_idle_s is not None:
        call(server_handle(), "set_pool_idle_s", float(pool_idle_s))
    if warm is not None and not (isinstance(warm, str) and warm.strip().lower() == "auto"):
        call(server_handle(), "warm", list(parse_warm(warm, cpus=1.0)))  # "auto": the cluster's server's own


def _server_up() -> None:
    """On the cluster: the training server, started where none runs yet."""
    server_handle()


def follow(job: Any, on_record: Callable[[dict[str, Any]], None], wait_s: float) -> dict[str, Any]:
    """The one loop that follows a job to its end: poll its record (each poll waits up to ``wait_s``
    for the job to end), hand each record to ``on_record``, and return the final one."""
    while True:
        record = job._record(until_done=wait_s)
        on_record(record)
        if record["status"] in DONE:
            return record
