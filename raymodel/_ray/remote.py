"""A cluster this process is not a node of, reached through Ray's Jobs API on its dashboard's port.

``rm.init(address="http://HEAD:8265")`` (or ``RAY_ADDRESS=http://HEAD:8265``) makes this process a
client of a cluster: it runs no raylet and starts no Ray. What it asks of the cluster (``call``) runs
in a driver there (``_Session``): a job of Ray's whose runtime env is what the client's ``runtime_env``
names (``py_modules``, ``pip``, ``env_vars``), which runs the client's calls one after another. Each
call, the function and its arguments pickled here (the user's classes by value), goes to the cluster's
package store through the dashboard; the driver (``serve``) takes it, joins the cluster, runs it and
writes what it has to say to its standard output as marked lines. This process reads them as Ray
streams the driver's log (a websocket: nothing polls here): events as they come (a row, what a job
waits for), then the function's value or its exception, raised here as it was raised there.

The client's ``runtime_env`` goes further than the driver: it names it in ``JOB_ENV`` (``job_env``),
and each job the driver submits carries it to the training server, which starts the job's runner and
pool with it (``with_job_env``). Actors inherit the runtime env of the job that made them, and none
can unset a field of it, so the server itself is started by a call without it (``bare``: in a
driver of its own, ended once it answered): what one client named is no other client's.

Connecting checks, before anything is submitted, that the address answers and that the cluster
takes this process's token (Ray's token auth). That the cluster runs the same raymodel, Ray and
Python (the pickles that travel need all three the same) is the first thing a driver says, before
this process sends it anything: a call to a cluster of other versions runs nothing there and raises
here, naming both sides.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import os
import queue
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from raymodel._internal import serialization
from raymodel.exceptions import RayModelError, SettingsError

#: What starts a line of the cluster's side meant for the client: a message's kind and its pickle.
MARK = "\x1eraymodel-call "
#: The lines Ray's job manager writes at a job's start, which say nothing to the user.
_RAYS_OWN = ("Runtime env is setting up.", "Running entrypoint for job ")
#: Ray's loggers that say, on the client, each call's package upload and the end of its log stream.
_RAYS_CHATTY = (
    "ray.dashboard.modules.dashboard_sdk",
    "ray.dashboard.modules.job.sdk",
    "ray._private.runtime_env.packaging",
)
_RAYS_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+INFO ")


class ClusterError(RayModelError, ConnectionError):
    """The cluster at an address cannot be used: it does not answer, refuses the token, or runs other
    versions than this process."""


@dataclasses.dataclass
class Cluster:
    """The cluster this process is a client of."""

    address: str
    #: What every call's job carries besides its own package (``rm.init(runtime_env=...)``).
    runtime_env: dict[str, Any]
    #: raymodel's, Ray's and Python's versions on the cluster.
    versions: dict[str, str]
    client: Any = dataclasses.field(repr=False, default=None)
    #: The drivers there that run this process's calls and have none now, by their runtime env.
    idle: dict[str, list[_Session]] = dataclasses.field(repr=False, default_factory=dict)
    lock: threading.Lock = dataclasses.field(repr=False, default_factory=threading.Lock)

    def uploaded_env(self) -> dict[str, Any]:
        """``runtime_env`` as the cluster holds it: each ``py_modules`` folder (or module) in Ray's
        package store (uploaded now where its content is not there yet), named by its URI."""
        if not self.runtime_env:
            return {}
        env = copy.deepcopy(self.runtime_env)
        if env.get("py_modules"):
            self.client._upload_py_modules_if_needed(env)  # Ray's own step of `submit_job`
        env.pop("excludes", None)  # the uploads' own: URIs have none
        return env

    def session(self, env: dict[str, Any]) -> _Session:
        """A driver of ``env`` for a call: an idle one far from its idle end, or one started now."""
        key = json.dumps(env, sort_keys=True)
        with self.lock:
            idle = self.idle.setdefault(key, [])
            while idle:
                session = idle.pop()
                if session.fresh():
                    return session
                session.end()
        return _Session.new(self, env, key)

    def give_back(self, session: _Session) -> None:
        """A session whose call has ended: kept for the next call (at most ``_KEEP`` per env), or ended."""
        with self.lock:
            idle = self.idle.setdefault(session.key, [])
            if len(idle) < _KEEP and session.fresh():
                idle.append(session)
                return
        session.end()

    def end_sessions(self) -> None:
        """End every idle session's driver (this process is done with the cluster)."""
        with self.lock:
            ending = [session for idle in self.idle.values() for session in idle]
            self.idle.clear()
        for session in ending:
            session.end()

    def put_package(self, name: str, payload: bytes) -> None:
        """Put ``payload`` in the cluster's package store as ``gcs://NAME`` (through the dashboard)."""
        answer = self.client._do_request("PUT", f"/api/packages/gcs/{name}", data=payload)
        if answer.status_code != 200:
            raise ClusterError(
                f"The cluster at {self.address} did not take a call ({answer.status_code}): {answer.text[:500]}"
            )


#: How long a driver of calls (``_Session``) waits for its next call before it ends.
SESSION_IDLE_S = 300.0
#: How often such a driver looks for its next call in the package store.
_LOOK_S = 0.1
#: The idle drivers a client keeps per runtime env (calls made at once start more; those end as they
#: come back).
_KEEP = 2

_CLUSTER: list[Cluster] = []


def is_dashboard_address(address: str | None) -> bool:
    """Whether ``address`` names a cluster by its dashboard's HTTP address (the Jobs API's)."""
    return isinstance(address, str) and address.startswith(("http://", "https://"))


def active() -> Cluster | None:
    """The cluster this process is a client of: the one ``connect`` reached, or the one that
    ``RAY_ADDRESS=http://...`` names (reached now); ``None`` where this process uses Ray itself."""
    if _CLUSTER:
        return _CLUSTER[0]
    address = os.environ.get("RAY_ADDRESS") or ""
    if is_dashboard_address(address) and not in_call():
        return connect(address)
    return None


def versions_here() -> dict[str, str]:
    """raymodel's, Ray's and Python's (its minor version) in this process."""
    from importlib import metadata

    import ray

    try:
        ours = metadata.version("raymodel")
    except metadata.PackageNotFoundError:  # a source tree never installed
        ours = "0+unknown"
    return {
        "raymodel": ours,
        "ray": ray.__version__,
        "python": ".".join(map(str, sys.version_info[:2])),
    }


def connect(address: str, runtime_env: dict[str, Any] | None = None) -> Cluster:
    """Reach the cluster at ``address`` (``http://HEAD:8265``) and check it, before anything is
    submitted: it answers, takes this process's token, runs this process's versions."""
    if runtime_env is not None and not isinstance(runtime_env, dict):
        raise SettingsError(f"`runtime_env` must be a dict of Ray's runtime env fields (got {runtime_env!r}).")
    if "working_dir" in (runtime_env or {}):
        raise SettingsError(
            "`runtime_env` takes `py_modules` here, not `working_dir`: each call of the cluster's runs in a "
            "folder of its own. Name the folders of your own packages in `py_modules`."
        )
    from raymodel._internal import locations, storage

    for folder in (runtime_env or {}).get("py_modules", ()):
        if isinstance(folder, (str, Path)) and Path(folder).is_dir():
            _check_package_size(Path(folder), (runtime_env or {}).get("excludes"))
    home = locations.home()
    if not storage.is_uri(home):
        raise SettingsError(
            f"Off the cluster, RAYMODEL_HOME must be storage that both this machine and the cluster reach "
            f"(s3://bucket/raymodel, gs://...): it is {home}, a folder of this machine, which the cluster cannot "
            "read. Set RAYMODEL_HOME to a URI (the cluster's own, if it has one) and connect again."
        )
    _refuse_local(
        "RAYMODEL_REGISTRY",
        os.environ.get("RAYMODEL_REGISTRY"),
        "leave it unset (the registry is then RAYMODEL_HOME's)",
    )
    client = _client(address)
    # Ray's lines about each call's package upload and log stream say nothing to a user (its modules
    # set their loggers' level when imported: after the client's import, then).
    for name in _RAYS_CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    cluster = Cluster(address.rstrip("/"), dict(runtime_env or {}), {}, client)
    _end_sessions()
    _CLUSTER[:] = [cluster]
    return cluster


def package_limit() -> int:
    """The largest package Ray's package store takes (its gRPC message size: ``RAY_max_grpc_message_size``)."""
    from ray._private.runtime_env import packaging

    return int(packaging.GCS_STORAGE_MAX_SIZE)


def _check_package_size(folder: Path, excludes: list[str] | None) -> None:
    """A ``SettingsError`` for a ``py_modules`` folder whose package Ray's package store would refuse,
    before anything is uploaded: its size as Ray packs it (Ray's own zip, which stores the files as they
    are, less what ``excludes`` and a .gitignore leave out; made only when the files alone pass the
    limit) and the limit."""
    limit = package_limit()
    raw = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    if raw < limit:
        return
    from ray._private.runtime_env.packaging import create_package

    with tempfile.TemporaryDirectory(prefix="raymodel-size-") as scratch:
        package = Path(scratch) / "package.zip"
        create_package(str(folder), package, include_gitignore=True, include_parent_dir=True, excludes=excludes)
        size = package.stat().st_size
    if size >= limit:
        raise SettingsError(
            f"`runtime_env['py_modules']`: {folder} makes a package of {_mib(size)}, and Ray's package store "
            f"takes at most {_mib(limit)} (RAY_max_grpc_message_size). Leave its large files out (runtime_env "
            "'excludes', a .gitignore or .rayignore there), put data on the storage (RAYMODEL_HOME), and connect again."
        )


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def _other_versions(cluster: Cluster, theirs: dict[str, str]) -> ClusterError | None:
    """The error for a cluster whose versions (a call's driver's) are not this process's, if they are not."""
    problem = version_problem(theirs, versions_here())
    if problem is None:
        return None
    return ClusterError(
        f"The cluster at {cluster.address} runs other versions than this process ({problem}): the model "
        "classes and data that travel are pickles, which need the same raymodel, Ray and Python on both "
        "sides. Install the cluster's versions here (or the image's there) and connect again."
    )


def refuse_local(what: str, location: str | None) -> None:
    """Off the cluster, ``location`` (a setting naming storage) must be a URI the cluster reaches too:
    a ``SettingsError`` naming it where it is a folder of this machine. Nothing where this process is
    not a client off the cluster, or ``location`` is ``None``."""
    if location is not None and active() is not None:
        _refuse_local(what, location, "leave it out (RAYMODEL_HOME's storage is used)")


def _refuse_local(what: str, location: str | None, instead: str) -> None:
    from raymodel._internal import storage

    if location and not storage.is_uri(str(location)):
        raise SettingsError(
            f"Off the cluster, {what} must be storage that the cluster reaches too (s3://bucket/path, gs://...): "
            f"{location} is a folder of this machine, which the cluster cannot read. Give a URI, or {instead}."
        )


def version_problem(theirs: dict[str, str], ours: dict[str, str]) -> str | None:
    """How the cluster's versions differ from this process's (``"ray 2.59 there, 2.60 here; ..."``), if they do."""
    differ = [f"{name} {theirs.get(name)} there, {ours[name]} here" for name in ours if theirs.get(name) != ours[name]]
    return "; ".join(differ) or None


def disconnect() -> None:
    """Forget the cluster (its drivers of this process's calls end): the next call uses Ray here again."""
    _end_sessions()
    _CLUSTER.clear()


def _client(address: str) -> Any:
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    if "RAY_AUTH_MODE" not in os.environ and _token_here():
        # A token given after Ray's import (which reads the mode once): Ray's own step for a token it finds.
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()
    AuthenticationTokenLoader.instance().reset_cache()  # the token as it is now, not as a refused try read it
    try:
        with _only(address):
            return JobSubmissionClient(address)
    except AuthenticationError as exc:
        missing = "Missing" in str(exc) or not _token_here()
        why = "this process sent no token" if missing else "this process's token is not the cluster's"
        raise ClusterError(
            f"The cluster at {address} uses Ray's token auth and {why}. Put the cluster's token (on its head: "
            "`ray get-auth-token`) in RAY_AUTH_TOKEN, or in ~/.ray/auth_token (RAY_AUTH_TOKEN_PATH names "
            "another file), and connect again."
        ) from None
    except ConnectionError as exc:
        raise ClusterError(
            f"No Ray cluster answers at {address} ({_first_line(exc)}). Give the address of the head's dashboard "
            "(`ray start --head --dashboard-host=0.0.0.0`, port 8265 unless `--dashboard-port` says another; "
            "`raymodel server start --host ADDRESS` prints it) and check that this machine reaches it."
        ) from None


@contextlib.contextmanager
def _only(address: str) -> Iterator[None]:
    """Ray's Jobs API client takes the address in RAY_API_SERVER_ADDRESS or RAY_ADDRESS over the one it
    is given: while it is made, those name ``address``."""
    names = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
    kept = {name: os.environ.get(name) for name in names}
    os.environ["RAY_API_SERVER_ADDRESS"] = address
    try:
        yield
    finally:
        for name, value in kept.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _token_here() -> bool:
    """Whether this process has a token to send: RAY_AUTH_TOKEN, or a file where Ray looks for one."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or Path(path or Path.home() / ".ray" / "auth_token").is_file()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ------------------------------------------------------------ what jobs need
#: Where a process finds the runtime env of the jobs it submits (JSON, the cluster's form: URIs): set in
#: a call's driver (by its client), in the runners and pools of a job that has one, and by
#: ``rm.init(runtime_env=...)`` on a node.
JOB_ENV = "RAYMODEL_JOB_ENV"


def job_env() -> dict[str, Any]:
    """What this process's jobs need where they run, besides what the cluster has installed: the
    runtime env ``rm.init(runtime_env=...)`` named (its ``py_modules``, ``pip``, ``env_vars``), as the
    cluster holds it; ``{}`` where none was named. The training server starts each such job's runner
    and pool with it (``with_job_env``)."""
    if _CLUSTER:
        return _CLUSTER[0].uploaded_env()
    named = os.environ.get(JOB_ENV)
    return json.loads(named) if named else {}


def with_job_env(env: dict[str, Any]) -> dict[str, Any] | None:
    """``env`` as the runtime env of an actor that runs jobs of it (a runner, a pool), or ``None`` for
    none: it names itself in ``JOB_ENV`` too, so that the jobs its processes submit (a Tune trial's
    worker group) carry it on."""
    if not env:
        return None
    return {**env, "env_vars": {**env.get("env_vars", {}), JOB_ENV: json.dumps(env, sort_keys=True)}}


def env_digest(env: dict[str, Any]) -> str:
    """A short name of ``env``'s content: jobs of one runtime env share pools, others do not."""
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:8]


# ------------------------------------------------------------------ calls
def call(
    fn: Callable[..., Any],
    *args: Any,
    on_event: Callable[[Any], None] | None = None,
    by_value: tuple = (),
    bare: bool = False,
) -> Any:
    """``fn(*args)`` on the cluster, in a driver of the cluster's (a session: ``_Session``); each
    ``emit(event)`` of ``fn`` reaches ``on_event`` here as it is made. Returns what ``fn`` returned, or
    raises what it raised. ``by_value``: objects whose classes' modules travel by value (they need not
    exist on the cluster). ``bare``: without the client's ``runtime_env``, in a driver of its own (what
    starts the training server, whose actors would keep it: Ray's actors inherit the runtime env of the
    job that made them, and no child unsets it)."""
    cluster = active()
    if cluster is None:
        raise RayModelError(
            "This process is not a client of a cluster off this machine: `rm.init(address='http://HEAD:8265')`."
        )
    payload = serialization.dumps((fn, args), *by_value)
    if len(payload) >= package_limit():
        raise SettingsError(
            f"What this call takes to the cluster ({getattr(fn, '__qualname__', fn)}: the model, its data, its "
            f"settings) pickles to {_mib(len(payload))}, and Ray's package store takes at most "
            f"{_mib(package_limit())} (RAY_max_grpc_message_size). Put the weights on the storage both reach "
            "(`model.save('s3://...')`, then serve or load that URI) and call again."
        )
    env = _call_env(cluster, bare)
    for _ in range(2):
        session = cluster.session(env)
        try:
            outcome = session.run(payload, on_event)
        except BaseException:  # a KeyboardInterrupt too: the driver takes it as the call's own, and ends
            session.end()
            raise
        if outcome is not None:
            if bare:
                session.end()  # its env is no client's: no other call runs there
            else:
                cluster.give_back(session)
            return _answer(outcome)
        if session.took:
            break
        # The driver ended before it took the call (it was at its idle end): another one takes it.
    raise ClusterError(
        f"A call of the cluster's ({getattr(fn, '__qualname__', fn)}) ended without an answer: "
        + _job_failure(cluster, session.job)
    )


def _call_env(cluster: Cluster, bare: bool) -> dict[str, Any]:
    """The runtime env of a call's driver: the client's (unless ``bare``), and this process's storage
    (runs, the registry, serve checkpoints), not the head's default, so that what the client writes and
    reads is where the cluster writes and reads."""
    users = {} if bare else cluster.uploaded_env()
    env = dict(users)
    ours = {k: os.environ[k] for k in ("RAYMODEL_HOME", "RAYMODEL_REGISTRY") if os.environ.get(k)}
    if users:
        ours[JOB_ENV] = json.dumps(users, sort_keys=True)
    env["env_vars"] = {**ours, **env.get("env_vars", {}), _ON_CLUSTER: "1"}
    return env


def _answer(outcome: dict[str, Any]) -> Any:
    if "raise" in outcome:
        raise outcome["raise"]
    if "error" in outcome:
        raise RayModelError(outcome["error"])
    return outcome["return"]


class _Session:
    """A driver of the cluster's (a job of Ray's) that runs this client's calls one after another, for
    as long as they come: one driver's start (a process that imports Ray and raymodel, and Ray's job
    supervisor) for many calls, not one for each.

    It reads each call from Ray's package store (``gcs://NAME_N.pkl``, which this process puts there
    through the dashboard, the only port it reaches), says ``took N``, runs it, and sends its events and
    its value as marked lines of its log, which this process reads as Ray streams it (a websocket, for
    the session's life). A driver given no call for ``SESSION_IDLE_S`` ends; this process gives a session
    no call once it has been idle half that long, and takes another (or starts one).

    Ray has no public API for this: the call goes through the Jobs SDK's request (``_do_request``, the
    PUT of Ray's own package upload) and the driver reads it with ``GcsClient``'s key-value calls (Ray
    2.60); the off-cluster lane (``tests/test_off_cluster.py``) checks both when Ray is upgraded."""

    def __init__(self, cluster: Cluster, job: str, name: str, key: str) -> None:
        self.cluster, self.job, self.name, self.key = cluster, job, name, key
        self.calls, self.took, self.ended = 0, False, False
        self.idle_since = time.monotonic()
        self.idle_s = SESSION_IDLE_S  # its driver's (given as it starts)
        self.lines: queue.SimpleQueue[str | BaseException | None] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name="raymodel-cluster-log", daemon=True)
        self._reader.start()

    @classmethod
    def new(cls, cluster: Cluster, env: dict[str, Any], key: str) -> _Session:
        name = f"raymodel_session_{os.urandom(8).hex()}"
        job = cluster.client.submit_job(
            entrypoint=(
                "python -c 'import sys; from raymodel._ray.remote import serve; serve(sys.argv[1], "
                f"float(sys.argv[2]))' {name} {SESSION_IDLE_S:g}"
            ),
            runtime_env=env,
            metadata={"raymodel": "session"},
        )
        session = cls(cluster, job, name, key)
        if not session.start():
            session.end()
            raise ClusterError(
                "A driver of the cluster's ended before it said its versions: " + _job_failure(cluster, job)
            )
        return session

    # ------------------------------------------------------------ the log
    def _read(self) -> None:
        async def tail() -> None:
            buffer = ""
            async for chunk in self.cluster.client.tail_job_logs(self.job):
                buffer += chunk
                *lines, buffer = buffer.split("\n")
                for text in lines:
                    self.lines.put(text)
            if buffer:
                self.lines.put(buffer)

        try:
            asyncio.run(tail())
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            self.lines.put(exc)
        self.lines.put(None)

    def _next(self) -> str | None:
        """The log's next line; ``None`` once it has ended. Waits in short steps: a KeyboardInterrupt
        reaches the caller between them."""
        while True:
            try:
                item = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                self.ended = True
                raise item
            if item is None:
                self.ended = True
            return item

    # ------------------------------------------------------------ calls
    def start(self) -> bool:
        """Read the driver's first line, its versions (checked against this process's); ``False`` where
        its log ended before it said them."""
        while (text := self._next()) is not None:
            marked = _marked(text)
            if marked is None:
                _say_here(text)
            elif marked[0] == "versions":
                self.cluster.versions = json.loads(marked[2])
                if (other := _other_versions(self.cluster, self.cluster.versions)) is not None:
                    self.end()
                    disconnect()
                    raise other
                return True
        _check_importable(self.cluster, self.job)
        return False

    def run(self, payload: bytes, on_event: Callable[[Any], None] | None) -> dict[str, Any] | None:
        """Send the call ``payload`` and follow it; its outcome, or ``None`` where the driver ended first."""
        self.calls += 1
        self.took = False
        self.cluster.put_package(f"{self.name}_{self.calls}.pkl", payload)
        return self.follow(self.calls, on_event)

    def follow(self, number: int, on_event: Callable[[Any], None] | None) -> dict[str, Any] | None:
        """The marked lines of call ``number`` to its outcome (``return``, ``raise`` or ``error``), each
        event handed to ``on_event`` as it comes; ``None`` where the log ends first."""
        while (text := self._next()) is not None:
            marked = _marked(text)
            if marked is None:
                _say_here(text)
                continue
            kind, of, body = marked
            if of != number:
                continue
            if kind == "took":
                self.took = True
                continue
            value = serialization.loads(base64.b64decode(body)) if body else None
            if kind == "event":
                if on_event is not None:
                    on_event(value)
                continue
            self.took = True
            self.idle_since = time.monotonic()
            return {kind: value}
        return None

    def fresh(self) -> bool:
        """Whether this session may take a call: its driver is far from its idle end."""
        alive = not self.ended and self._reader.is_alive()  # its log has not ended
        return alive and time.monotonic() - self.idle_since < self.idle_s / 2

    def end(self) -> None:
        """Stop the driver (a call under way there gets a KeyboardInterrupt). Not waited for long: this
        process may be ending, and the cluster gone (a driver left behind ends at its idle end)."""
        self.ended = True
        with contextlib.suppress(Exception):
            self.cluster.client._do_request("POST", f"/api/jobs/{self.job}/stop", timeout=5)


def _marked(text: str) -> tuple[str, int, str] | None:
    """A marked line's kind, call number and body; ``None`` for any other line."""
    if not text.startswith(MARK):
        return None
    kind, _, rest = text[len(MARK) :].partition(" ")
    number, _, body = rest.partition(" ")
    try:
        return kind, int(number), body.strip()
    except ValueError:
        return None


def _say_here(line: str) -> None:
    """A line of the call's driver that is not a message: the user's and raymodel's own output there."""
    if not line.strip() or line.startswith(_RAYS_OWN) or _RAYS_LOG_LINE.match(line):
        return
    print(line, file=sys.stderr, flush=True)


def _check_importable(cluster: Cluster, job: str) -> None:
    """A call's driver that never said its versions: a ``ClusterError`` where raymodel (or what it
    imports) is missing where the cluster's jobs run."""
    try:
        logs = cluster.client.get_job_logs(job)
    except Exception:  # noqa: BLE001 - then the call's own failure says what there is
        return
    missing = re.search(r"(?:ModuleNotFoundError|ImportError): (.*)", logs)
    if missing is None:
        return
    disconnect()
    raise ClusterError(
        f"raymodel cannot be imported where the cluster's jobs run at {cluster.address} ({missing.group(1).strip()}"
        "; their `python` is the one on the PATH of the head's `ray start`). Install raymodel "
        f"{versions_here()['raymodel']} with its extras in the cluster's image (or environment) on every node, "
        "and connect again."
    )


def _job_failure(cluster: Cluster, job: str) -> str:
    try:
        info = cluster.client.get_job_info(job)
        logs = cluster.client.get_job_logs(job).strip().splitlines()
    except Exception as exc:  # noqa: BLE001 - said as it is
        return f"job {job}: {_first_line(exc)}"
    tail = "\n".join(logs[-12:])
    return f"Ray's job {job} is {info.status} ({info.message or 'no message'}); its log ends:\n{tail}"


def _end_sessions() -> None:
    for cluster in _CLUSTER:
        cluster.end_sessions()


atexit.register(_end_sessions)  # this process's drivers on the cluster end with it, not at their idle end


# ---------------------------------------------------------- the cluster's side
#: Set in a call's driver: it is on the cluster, whatever RAY_ADDRESS says.
_ON_CLUSTER = "RAYMODEL_CALL_DRIVER"


def in_call() -> bool:
    """Whether this process is a call's driver on the cluster (a client off it made the call)."""
    return bool(os.environ.get(_ON_CLUSTER))


#: The number of the call a driver runs now (its marked lines name it).
_NOW = [1]


def emit(event: Any) -> None:
    """Tell the client ``event`` now (in a call's driver; elsewhere nothing happens)."""
    if in_call():
        _send("event", event)


def _send(kind: str, value: Any) -> None:
    _send_line(kind, base64.b64encode(serialization.dumps(value)).decode())


def _send_line(kind: str, body: str = "", number: int | None = None) -> None:
    out = sys.__stdout__ or sys.stdout  # the driver's own, where sys.stdout is redirected (``raymodel`` commands)
    out.write(f"{MARK}{kind} {_NOW[0] if number is None else number} {body}\n")
    out.flush()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # Ray's stop of the job (the client's Ctrl-C): the call ends as it would here


def serve(name: str, idle_s: float) -> None:
    """A session's driver (``_Session``): its versions, then each call the client puts in the package store
    (``gcs://NAME_1.pkl``, ``NAME_2.pkl``, ...) taken, run and answered in turn, until none comes for
    ``idle_s`` seconds or the client stops the job (a KeyboardInterrupt: it ends here too)."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    signal.signal(signal.SIGTERM, _interrupt)
    _send_line("versions", json.dumps(versions_here()), 0)  # the client sends nothing where they differ
    store = GcsClient(address=os.environ["RAY_ADDRESS"])  # the cluster's GCS (Ray's job manager sets it)
    number, idle_since = 1, time.monotonic()
    try:
        while time.monotonic() - idle_since < idle_s:
            key = f"gcs://{name}_{number}.pkl".encode()
            payload = store.internal_kv_get(key, None)
            if payload is None:
                time.sleep(_LOOK_S)
                continue
            store.internal_kv_del(key, False, None)
            _NOW[0] = number
            _send_line("took")
            if not _run(payload):
                return  # interrupted: the client ended this session
            number, idle_since = number + 1, time.monotonic()
    except KeyboardInterrupt:
        return


def _run(payload: bytes) -> bool:
    """Run a call and send its value (or exception); ``False`` where it was interrupted."""
    try:
        fn, args = serialization.loads(payload)
        value = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the client raises it
        try:
            _send("raise", exc)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
            _send("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        return not isinstance(exc, KeyboardInterrupt)
    _send("return", value)
    return True
