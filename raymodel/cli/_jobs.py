"""``raymodel server start|stop|status`` and ``raymodel jobs list|show|logs|stop|wait|update``.

``server start`` runs a persistent local Ray head (``ray start --head``, its dashboard started beside its
raylet: ``raymodel/_ray/ray_start.py``) plus
the training server, and writes where it is to ``$RAYMODEL_SERVER_FILE``
(default ``~/.raymodel/server.json``); ``rm.init()`` and the ``jobs``
commands in any process then attach to it (``RAY_ADDRESS`` overrides).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from raymodel import jobs
from raymodel._ray.cluster import (
    head_problem,
    joinable_server,
    own_api_server,
    ray_defaults,
    running_server,
    server_file,
)
from raymodel._ray.ingress import end_haproxy, resolve_ingress, with_serve_env
from raymodel.cli._stop import TERM_WAIT_S, drain, start_times, terminate, with_descendants
from raymodel.exceptions import RayModelError
from raymodel.jobs import UPDATABLE, init, parse_warm, shown_warm, warm_cpus

#: How long `server start --wait` waits for its warm pools before it fails (the server stays up).
WARM_WAIT_S = 600.0


def add_commands(sub: Any) -> None:
    srv = sub.add_parser("server", help="the training server: a persistent local Ray head plus the job server")
    srv_sub = srv.add_subparsers(dest="command", required=True)
    start = srv_sub.add_parser("start", help="start a local Ray head and the job server")
    start.add_argument("--port", type=int, default=6379, help="the Ray head's port (default 6379)")
    start.add_argument("--dashboard-port", type=int, default=8265)
    start.add_argument(
        "--host",
        default="127.0.0.1",
        help="the head's address that other machines reach (its node's IP; 0.0.0.0: every address, Ray picks the "
        "node's): worker nodes join it at HOST:PORT and clients off the cluster use http://HOST:DASHBOARD_PORT "
        "(default 127.0.0.1: this machine only)",
    )
    start.add_argument("--num-cpus", type=int, help="CPUs to offer (default: all)")
    start.add_argument(
        "--pool-idle-s",
        type=float,
        default=None,
        help="seconds an idle pool (a resident worker group) lives before it gives its resources back (default 120)",
    )
    start.add_argument(
        "--warm",
        default=None,
        help="pools to start at once and keep warm, BACKEND:WORKERS[,...] (e.g. torch:2,lightning:1; 'none'), and "
        "rllib by name alone (its Algorithm's process, started ahead); default: RAYMODEL_WARM, else 'auto' "
        "(torch:2 where torch is installed: Lightning's and transformers' too; torch:2,torch:1 where the CPUs "
        "hold both)",
    )
    start.add_argument(
        "--wait",
        action="store_true",
        help=f"return once the warm pools are ready to take a job (at most {WARM_WAIT_S:g} s), not as soon as "
        "the server answers",
    )
    start.add_argument(
        "--attach",
        action="store_true",
        help="Ray runs on this node already (a KubeRay head, `ray start --head`): wait for it (RAY_ADDRESS, else "
        "this node's), start the training server there with --warm and --pool-idle-s, and return",
    )
    start.add_argument(
        "--attach-wait-s", type=float, default=300.0, help="how long --attach waits for Ray to answer (default 300)"
    )
    start.set_defaults(handler=_server_start)
    stop = srv_sub.add_parser(
        "stop",
        help="stop the job server and the Ray head it runs on; running jobs first checkpoint at an epoch boundary",
    )
    stop.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="seconds running jobs get to end their epoch and write a checkpoint, so that the next `server start` "
        "resumes them from there (default 30; 0: stop at once, they resume from their newest checkpoint)",
    )
    stop.set_defaults(handler=_server_stop)
    srv_sub.add_parser("status", help="where the server runs, its jobs by status, and its pools").set_defaults(
        handler=_server_status
    )

    jobs = sub.add_parser("jobs", help="train and tune jobs").add_subparsers(dest="command", required=True)
    jobs.add_parser("list", help="every job").set_defaults(handler=_jobs_list)
    for name, handler, text in (
        ("show", _jobs_show, "a job's record"),
        ("stop", _jobs_stop, "stop a job"),
        ("wait", _jobs_wait, "wait until a job ends; exit 1 if it failed"),
    ):
        cmd = jobs.add_parser(name, help=text)
        cmd.add_argument("id")
        cmd.set_defaults(handler=handler)
    update = jobs.add_parser("update", help="change a running job from its next epoch boundary")
    update.add_argument("id")
    add_set_option(update, f"a config key or a setting ({', '.join(UPDATABLE)})", dest="changes")
    update.set_defaults(handler=_jobs_update)
    logs = jobs.add_parser("logs", help="a job's log")
    logs.add_argument("id")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    logs.set_defaults(handler=_jobs_logs)


def add_set_option(cmd: Any, what: str, dest: str = "pairs") -> None:
    """``--set KEY=VALUE`` (repeated, into ``dest``): ``what`` a key names."""
    help = f"{what}; the value is read as JSON, else text"
    cmd.add_argument("--set", dest=dest, action="append", default=[], metavar="KEY=VALUE", help=help)


def _processes(marker: str, *more: str) -> list[int]:
    """Process ids whose command line holds ``marker`` and each of ``more`` (``ps``: Linux and macOS)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [
        int(line.split(None, 1)[0])
        for line in out.splitlines()
        if all(m in line for m in (marker, *more)) and line.split(None, 1)[0].isdigit()
    ]


def attach() -> None:
    """Join the cluster of ``RAY_ADDRESS`` or of ``raymodel server start``; never start a new one."""

    address = os.environ.get("RAY_ADDRESS") or (joinable_server() or {}).get("address")
    if not address:
        raise RayModelError(
            "No raymodel server is running: start one with `raymodel server start` (or set RAY_ADDRESS to a cluster)."
        )
    init(address=address)


def _head_ip() -> str:
    """The node IP that ``ray start`` chooses for a head on every address (``--host 0.0.0.0``)."""
    from ray._private.services import get_node_ip_address

    return str(get_node_ip_address())


def _cpus(args: argparse.Namespace) -> float:
    return float(args.num_cpus if args.num_cpus is not None else os.cpu_count() or 1)


def _on_the_head(command: str) -> None:
    """``server start|stop`` run on the head's machine; off the cluster they are refused in words."""
    from raymodel._ray import remote

    if remote.is_dashboard_address(os.environ.get("RAY_ADDRESS")):
        raise RayModelError(
            f"`raymodel server {command}` runs on the cluster's head machine, not from a client off the cluster. "
            "From here, the first job (or `raymodel --address URL server status`) starts the training server "
            "on the cluster; a head is started there with `raymodel server start --host ADDRESS` (or `ray start "
            "--head`), and ended there."
        )


def _server_start(args: argparse.Namespace) -> None:
    _on_the_head("start")
    if args.attach:
        return _attach_server(args)
    already = joinable_server()  # a head that cannot take work: an error that says to stop it first
    if already:
        print(f"a raymodel server is already running at {already['address']}")
        return
    warm = parse_warm(args.warm, _cpus(args))  # a bad value fails before anything starts
    needed = warm_cpus(warm) if args.wait else 0.0
    if needed > _cpus(args):
        raise RayModelError(
            f"`--wait`: the warm pools {shown_warm(warm)} hold {needed:g} CPUs together and this head "
            f"offers {_cpus(args):g}, so they can never all be ready: warm fewer workers, or leave out `--wait`."
        )
    temp_dir = f"/tmp/rms-{args.port}"  # short: Ray's socket paths must fit in 107 bytes
    cmd = [  # `ray start`, its dashboard started beside its raylet (raymodel/_ray/ray_start.py)
        sys.executable,
        "-m",
        "raymodel._ray.ray_start",
        "start",
        "--head",
        "--port",
        str(args.port),
        "--dashboard-host",
        args.host,
        "--dashboard-port",
        str(args.dashboard_port),
        "--temp-dir",
        temp_dir,
        "--disable-usage-stats",
    ]
    if args.host != "0.0.0.0":
        cmd += ["--node-ip-address", args.host]
    if args.num_cpus is not None:
        cmd += ["--num-cpus", str(args.num_cpus)]
    end_haproxy()  # what Ray instances that died left of their HTTP ingress (raymodel/_ray/ingress.py)
    env = with_serve_env(os.environ, resolve_ingress(None))  # the head's Serve: HAProxy unless told otherwise
    own_api_server(env, args.dashboard_port)  # the head's state API queries go to its own dashboard
    ray_defaults(env)  # Train's report poll, no preemption watcher, 2 footer readers: as `rm.init`'s local Ray
    haproxy = os.path.dirname(env.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", ""))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RayModelError(f"`ray start` failed: {(done.stderr or done.stdout).strip().splitlines()[-1]}")
    node_ip = args.host if args.host != "0.0.0.0" else _head_ip()
    address = f"{node_ip}:{args.port}"
    gcs = sorted(set(_processes(temp_dir)) & set(_processes("gcs_server")))
    raylet = _processes("raylet --raylet_socket_name", temp_dir)  # a raylet's end leaves a head no one joins
    import ray

    init(address=address, pool_idle_s=args.pool_idle_s, warm=warm)
    ray.get(jobs.server().list.remote())  # started and answering
    server_file().parent.mkdir(parents=True, exist_ok=True)
    server_file().write_text(
        json.dumps(
            {
                "address": address,
                "temp_dir": temp_dir,
                "gcs_pid": gcs[0] if gcs else -1,
                **({"raylet_pid": raylet[0]} if raylet else {}),
                "started": time.time(),
                "haproxy_dir": haproxy,
            }
        )
    )
    print(f"raymodel server running at {address}; attach with rm.init() or RAY_ADDRESS={address}")
    if args.host != "127.0.0.1":
        print(
            f"  other machines: worker nodes `ray start --address {address}`, clients off the cluster "
            f"`rm.init(address='http://{node_ip}:{args.dashboard_port}')` (with this head's RAY_AUTH_TOKEN)"
        )
    if warm:
        if not args.wait:
            print(f"warming pools in the background: {shown_warm(warm)} (`raymodel server status` shows them)")
            return
        print(f"warming pools: {shown_warm(warm)} ...", flush=True)
        print(f"warm pools ready: {shown_warm(warm)} ({jobs.wait_warm(warm, WARM_WAIT_S):.1f} s)")


def _attach_server(args: argparse.Namespace) -> None:
    """The training server on a head whose Ray another process started (KubeRay's ``ray start --head``,
    this container's ``postStart`` hook runs this): once Ray answers, the server is started there (a
    detached actor: it outlives this process), its warm pools in the background."""
    import ray

    warm = parse_warm(args.warm, _cpus(args))  # a bad value fails before any wait
    address = os.environ.get("RAY_ADDRESS") or "auto"
    deadline = time.monotonic() + args.attach_wait_s
    while True:
        try:
            init(address=address, pool_idle_s=args.pool_idle_s, warm=warm)
            break
        except ConnectionError as exc:  # Ray's head is still starting
            ray.shutdown()
            if time.monotonic() > deadline:
                raise RayModelError(
                    f"`--attach`: no Ray answered at {address} within {args.attach_wait_s:g} s ({exc}). Start Ray "
                    "first (`ray start --head`), or set RAY_ADDRESS to the head's GCS address."
                ) from None
            time.sleep(2.0)
    ray.get(jobs.server().list.remote())  # started and answering
    where = ray.get_runtime_context().gcs_address
    print(
        f"raymodel training server running on the Ray cluster at {where}"
        + (f"; warming {shown_warm(warm)}" if warm else "")
    )


def _server_stop(args: argparse.Namespace) -> int:
    """As ``ray stop`` does (SIGTERM, a wait, then SIGKILL of what remains, saying what), after running
    jobs had ``--grace-s`` to reach an epoch boundary and checkpoint (they wait PENDING for the next
    ``server start``, which resumes them from there)."""
    _on_the_head("stop")
    info = running_server()
    if info is None:
        print("no raymodel server is running")
        return 0
    if args.grace_s < 0:
        raise RayModelError(f"`--grace-s` must be >= 0; got {args.grace_s:g}")
    if args.grace_s > 0 and head_problem(info):
        print("its raylet has ended: no job can reach an epoch boundary; stopping without waiting")
    elif args.grace_s > 0:
        drain(info["address"], args.grace_s)
    # This head's processes (not another head's) and what they started, found before any ends.
    head = [pid for pid in _processes(info["temp_dir"]) if pid != os.getpid()]
    # and its Ray Client server, which names no folder of the head's, only its GCS's port
    head += _processes("ray.util.client.server", f":{info['address'].rsplit(':', 1)[-1]} ")
    pids = [pid for pid in with_descendants(head) if pid != os.getpid()]
    gcs, began = set(_processes("gcs_server")) & set(head), start_times(pids)
    # Its daemons first (its raylet ends its workers, as at any stop), then its GCS (a raylet whose GCS
    # went first waits for it, and had to be killed), then what of theirs still runs, killed: told to
    # end gently, a job server that outlives its node under load can take its runners' deaths in its
    # shutdown for the jobs' own (it leaves them to the next server when its node is gone:
    # ``Recovery.left_to_next_server``).
    killed = terminate([p for p in head if p not in gcs], wait_s=TERM_WAIT_S)
    killed += terminate(sorted(gcs), wait_s=TERM_WAIT_S)
    rest = start_times([p for p in pids if p not in gcs and p not in head])
    left = terminate([p for p, t in rest.items() if began.get(p) == t], wait_s=0.0, gently=False)
    if info.get("haproxy_dir"):  # the head's HTTP ingress ends with it (Ray leaves HAProxy running)
        end_haproxy(info["haproxy_dir"], orphans_only=False)
    server_file().unlink(missing_ok=True)
    shutil.rmtree(info["temp_dir"], ignore_errors=True)
    if info.get("haproxy_dir"):
        shutil.rmtree(info["haproxy_dir"], ignore_errors=True)
    ended = len(pids) - len(killed) - len(left)
    print(f"stopped the raymodel server at {info['address']}: {ended} process(es) ended", end="")
    if killed:
        names = ", ".join(f"{name} ({pid})" for pid, name in killed)
        print(f"; {len(killed)} still running after {TERM_WAIT_S:g} s were killed: {names}", end="")
    if left:
        names = ", ".join(f"{name} ({pid})" for pid, name in left)
        print(f"; {len(left)} that outlived the head were killed: {names}", end="")
    print()
    return 0


def _server_status(args: argparse.Namespace) -> int:
    from raymodel._ray import remote

    if remote.in_call():  # a client off the cluster asked: the cluster's server (started now if none runs)
        where = "the cluster's head"
    else:
        info = running_server()
        problem = "no raymodel server is running" if info is None else head_problem(info)
        if info is None or problem:
            print(problem)
            return 1
        where = info["address"]
    attach()
    counts: dict[str, int] = {}
    for record in jobs.records():
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    print(f"raymodel server at {where}; jobs: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"))
    pools = jobs.pools()
    note = " (resident worker groups; idle ones end by themselves, warm ones stay)" if pools else ""
    print(f"pools: {len(pools) or 'none'}{note}")
    now = time.time()
    for pool in pools:
        since = f"idle {now - pool.idle_since:.0f} s" if pool.idle_since else f"busy: {pool.job or 'starting'}"
        if pool.state == "starting":
            since = f"warming for {now - pool.started:.0f} s"
        held = ", ".join(f"{v:g} {k}" for k, v in sorted(pool.resources.items()))
        warm = "  warm" if pool.warm else ""
        print(f"  {pool.id}  {pool.key}  holds {held}  {since}  jobs run {pool.jobs_run}{warm}")
    return 0


def _jobs_list(args: argparse.Namespace) -> None:
    attach()
    rows = [["ID", "KIND", "PRIORITY", "STATUS", "ETA", "MODEL", "EPOCHS", "RESOURCES"]]
    records = jobs.records()
    holds = jobs.held(records)
    for r in records:
        rows.append(
            [
                r["id"],
                r["kind"],
                str(r.get("priority", 0)),
                r["status"] + (f" ({r['reason']})" if r.get("reason") else "") + _error_of(r),
                _eta(r),
                r["model_class"].rsplit(".", 1)[-1],
                str(r.get("epochs") or "-"),
                ", ".join(f"{v:g} {k}" for k, v in holds[r["id"]].items()) or "-",
            ]
        )
    if len(rows) == 1:
        print("(no jobs)")
        return
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _eta(record: dict[str, Any]) -> str:
    """``starts in ~12 s`` (PENDING), ``ends in ~40 s`` (RUNNING), ``-``."""
    eta = record.get("eta")
    if eta is None or record["status"] not in ("PENDING", "RUNNING"):
        return "-"
    return f"{'starts' if record['status'] == 'PENDING' else 'ends'} in ~{eta:.0f} s"


def parse_changes(pairs: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``["lr=1e-4", "num_epochs=40"]`` -> ``(config, settings)``; values are JSON where they parse."""
    config: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for key, value in parse_pairs(pairs).items():
        (settings if key in UPDATABLE else config)[key] = value
    return config, settings


def parse_pairs(pairs: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs -> ``{key: value}``; a value is JSON where it parses, else text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"raymodel: error: `--set {pair}`: write KEY=VALUE, e.g. `--set lr=1e-4`.")
        try:
            out[key.strip()] = json.loads(text)
        except ValueError:
            out[key.strip()] = text
    return out


def _jobs_update(args: argparse.Namespace) -> int:
    from raymodel.exceptions import SettingsError

    if not args.changes:
        raise SystemExit("raymodel: error: nothing to change: pass `--set KEY=VALUE` (one or more).")
    config, settings = parse_changes(args.changes)
    attach()
    try:
        change = jobs.get(args.id).update(config=config or None, settings=settings or None)
    except SettingsError as exc:
        print(f"raymodel: {exc}", file=sys.stderr)
        return 2
    shown = ", ".join(f"{k}={v!r}" for k, v in {**change["config"], **change["settings"]}.items())
    print(f"{args.id}: {shown} from its next epoch boundary")
    return 0


def _error_of(record: dict[str, Any]) -> str:
    """`` (the error line)`` of a FAILED job, its end for a table (the exception it ends with); else ``""``."""
    error = record.get("error") if record["status"] == "FAILED" else None
    if not error:
        return ""
    line = str(error).splitlines()[0]
    return f" ({'...' + line[-77:] if len(line) > 80 else line})"


def _jobs_show(args: argparse.Namespace) -> None:
    attach()
    job = jobs.get(args.id)
    rows = job.history()
    record = {**job._record(), "history_rows": len(rows)}
    record.pop("log", None)
    if record["kind"] == "release":  # its stages, a line each, before the record
        print(f"{job.id}: release, {record['status']}, stage {jobs.current_stage(rows, record['status'])}")
        for row in (r for r in rows if "end" in r):
            print(f"  {jobs.describe_stage(row)}")
    print(json.dumps(record, indent=2, default=str))


def _jobs_stop(args: argparse.Namespace) -> None:
    attach()
    jobs.get(args.id).stop()
    print(f"stopping {args.id}")


def _jobs_wait(args: argparse.Namespace) -> int:
    attach()
    job = jobs.get(args.id)
    result = job.wait()
    print(f"{args.id} {job.status}" + (f": {result!r}" if result is not None else ""))
    return 0


def _jobs_logs(args: argparse.Namespace) -> None:
    attach()
    job = jobs.get(args.id)
    shown = 0
    while True:
        lines = job.logs().splitlines()
        for line in lines[shown:]:
            print(line, flush=True)
        shown = len(lines)
        if not args.follow or job.status in jobs.DONE:
            return
        time.sleep(0.5)
