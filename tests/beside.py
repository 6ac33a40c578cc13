"""A second pytest session beside this one, for the modules that wait on Ray more than they compute.

Serve's tests mostly wait: a rollout's steps, autoscaling's delays, a replica seen down, a route
taken down. One after another, they leave a core of a 2-core machine idle for minutes (the modules
marked here kept the machine 36-49% busy in a suite run; moving pools', RLlib's and transformers'
too made both sessions slower: more computing at once, and the second session past its limit).

A module marked ``beside`` (in its ``pytestmark``) runs instead in a second pytest process with a
Ray instance, a ``RAYMODEL_HOME``, a Serve port (``RAYMODEL_SERVE_PORT``) and replica ports of its
own. That process is the last job of the background lane (``tests/lane.py``): it starts once the
lane's clusters are done, while this session runs its other tests. This session reports each of
its tests in its place at the end, as the second session ran it: setup, call and teardown, with
their output, tracebacks, skips and durations (pytest's own serialized reports, as pytest-xdist
sends them between its processes).

A test marked ``beside`` alone (on its function) goes too, after the marked modules' tests: one of
a module that computes, which itself mostly waits (a pool's idle timeout, a user's own Tuner, a
command line's server). The second session runs it once the Serve modules are done, while this
session's last modules leave a core idle.

Everything runs here as usual when the selection holds only such modules, or with
``RM_TEST_ONE_SESSION=1`` (for ``--pdb``, say).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import lane
import pytest
from _pytest.reports import TestReport

#: Set in the second session: the file its reports go to (one JSON line each).
REPORTS = "RM_TEST_BESIDE_REPORTS"
#: The name of the lane's job that runs the second session, and how long it may run: it took 881-1097 s
#: in clean-clone runs on a 2-core machine, and 1495 s on one half as fast (a 20M-step Python loop in
#: 2.7 s, not 1.4 s). The limit is a backstop for a hung session (each test has pytest-timeout's 600 s):
#: it must not be what fails a slow machine's run.
JOB = "beside"
LIMIT_S = 2400


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "beside: the module runs in a second pytest session beside this one (tests/beside.py)"
    )
    if os.environ.get(REPORTS):
        config.pluginmanager.register(Writer(config, Path(os.environ[REPORTS])), "raymodel-beside-writer")


def take(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Hand the selected tests of ``beside`` modules to the lane's last job (as its tests: they go
    after the other tests), if this session has other tests to run meanwhile."""
    if os.environ.get(REPORTS) or os.environ.get("RM_TEST_ONE_SESSION") == "1":
        return
    moved = [item for item in items if item.get_closest_marker("beside")]
    if not moved or len(moved) == len(items):
        return
    moved.sort(key=_marked_alone)  # the marked modules first, then the tests marked alone
    ids = [item.nodeid for item in moved]
    for item in moved:
        item.add_marker(pytest.mark.lane(JOB))
    lane.JOBS[JOB] = lane.Job(lambda scratch: run(scratch, ids, config.rootpath), 300, LIMIT_S + 60, True)
    REPLAY.path, REPLAY.ids = None, set(ids)


def _marked_alone(item: pytest.Item) -> bool:
    module = item.getparent(pytest.Module)
    return module is None or module.get_closest_marker("beside") is None


@dataclasses.dataclass
class Ended:
    """How the second session ended (``"exit code 1"``, ``"killed after its 1080 s"``), and its output."""

    how: str
    output: str


def run(scratch: Path, ids: list[str], root: Path) -> Ended:
    """The second session: ``pytest ids`` in a fresh process whose Ray, home and ports are its own."""
    from s3server import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYMODEL_", "PYTEST_ADDOPTS"))}
    env.update(
        {
            REPORTS: str(scratch / "reports.jsonl"),
            "RAYMODEL_SERVE_PORT": str(free_port()),
            "RAY_TMPDIR": str(scratch),  # its own `session_latest`
            # Serve gives each replica a port of the node from a range, the same in each Ray instance.
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "31001",
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "32000",
            "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": "41001",
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": "42000",
            # Its own mark (its session's end ends its own processes, not this one's), and this one's:
            # whatever it leaves, this session's end ends.
            lane.SESSION_MARK: uuid.uuid4().hex,
            lane.OUTER_MARK: os.environ[lane.SESSION_MARK],
        }
    )
    REPLAY.path = scratch / "reports.jsonl"
    command = [sys.executable, "-m", "pytest", *ids, "-q", "-p", "no:cacheprovider", "--basetemp", str(scratch / "t")]
    with open(scratch / "output.txt", "w") as output:
        try:
            done = subprocess.run(command, env=env, cwd=root, stdout=output, stderr=subprocess.STDOUT, timeout=LIMIT_S)
            how = f"exit code {done.returncode}"
        except subprocess.TimeoutExpired:  # killed: its tests not reported yet fail, saying so
            how = f"killed after its {LIMIT_S} s"
    return Ended(how, (scratch / "output.txt").read_text(errors="replace"))


class Writer:
    """The second session's side: each report, serialized, as soon as pytest makes it."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config, self.file = config, open(path, "a")

    def pytest_runtest_logreport(self, report: TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.file.write(json.dumps(data) + "\n")
        self.file.flush()


class Replay:
    """This session's side: the second session's reports, read as they come."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.ids: set[str] = set()
        self.offset = 0
        self.reports: dict[str, list[dict[str, Any]]] = {}

    def read(self) -> None:
        if self.path is None or not self.path.exists():
            return
        with open(self.path, "rb") as file:
            file.seek(self.offset)
            chunk = file.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self.offset += len(whole)
        for line in whole.splitlines():
            data = json.loads(line)
            if isinstance(data.get("longrepr"), list):  # a skip's (file, line, reason): JSON made it a list
                data["longrepr"] = tuple(data["longrepr"])
            self.reports.setdefault(data["nodeid"], []).append(data)

    def wait(self, item: pytest.Item) -> list[TestReport]:
        """The test's reports, once its teardown's is in; if the second session ends without it, an
        error saying how it ended."""
        hook = item.config.hook
        while True:
            self.read()
            got = self.reports.get(item.nodeid, [])
            future = lane.LANE.futures.get(JOB)
            if (got and got[-1]["when"] == "teardown") or future is None or future.done():
                break
            time.sleep(0.2)
        reports = [hook.pytest_report_from_serializable(config=item.config, data=data) for data in got]
        if not got or got[-1]["when"] != "teardown":
            when = "teardown" if got else "setup"
            reports.append(_error(item, when, _why(future)))
        return reports


def _why(future: Any) -> str:
    if future is None:
        return "the second session (tests/beside.py) never started"
    try:
        done = future.result()
    except BaseException as exc:  # noqa: BLE001 - said in the report
        return f"the second session (tests/beside.py) failed: {exc!r}"
    return (
        f"the second session (tests/beside.py) ended ({done.how}) without finishing this test; the end of its "
        f"output:\n{done.output[-4000:]}"
    )


def _error(item: pytest.Item, when: str, text: str) -> TestReport:
    keywords: dict[str, Any] = {name: 1 for name in item.keywords}
    return TestReport(item.nodeid, item.location, keywords, "failed", text, when)  # type: ignore[arg-type]


REPLAY = Replay()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A test of the second session: its reports, as if it ran here (nothing of it is set up here)."""
    if item.nodeid not in REPLAY.ids:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in REPLAY.wait(item):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
