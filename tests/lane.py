"""The background lane: tests whose work is a process with a Ray cluster of its own (a chaos run, a
cluster that loses nodes, a head serving through HAProxy, the demo as a user runs it).

Such a process needs nothing of the test session's Ray, so it runs from the start of the session, one
at a time on a thread of its own, while the session's tests run, at the same priority as they do.
A lower priority starved the lane's clusters into failures, each way it was tried (SCHED_IDLE: a Ray
node past its 30-s start, a Serve proxy killed for missing its 5-s ready check, a chaos run past 900 s;
a CPU group marked idle: a GCS not reached in 60 s; a group of a small ``cpu.shares``: the suite took
77 minutes in CI), while at the same priority the lane and the session share the machine evenly.
Its test waits for what it returned and checks it. The lane starts once the tests are selected (``-k``, ``-m``,
``--deselect``, a file: only the jobs of the tests that will run) and those tests move to the end of
the session, by when their processes have ended.

A test module registers its process with ``@job("name", expected_s)`` (a function of a scratch folder,
returning what the test checks) and marks its test ``@pytest.mark.lane("name")``; the test takes the
``lane`` fixture and calls ``lane.result("name")``, which re-raises whatever the process's function
raised, or a ``TimeoutError`` once the job has run past its limit (``limit_s``, three times what it is
expected to take unless given), counted from its start or from when its test asked, the later.

A job made ``last`` runs after the others whatever its length: the second session of
``tests/beside.py``, whose tests are the lane's too.

The module is a pytest plugin (``conftest.py`` registers it): its hooks start the lane after the
selection and end it with the session.

A session leaves no process of its own behind: every process it starts, the lane's clusters and
whatever they daemonize included, carries ``SESSION_MARK`` in its environment, and ``close`` (at the
session's end) ends those still running (SIGTERM, then SIGKILL) before it removes the lane's folders.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future, TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable

import pytest

#: The environment variable whose value marks this session's processes (inherited by every child).
SESSION_MARK = "RM_TEST_SESSION"
#: The variable that marks the processes of a session started by another (``tests/beside.py``) with the
#: outer one's mark: the outer session's end ends them too.
OUTER_MARK = "RM_TEST_OUTER_SESSION"


class Job:
    def __init__(self, fn: Callable[[Path], Any], expected_s: float, limit_s: float | None, last: bool = False) -> None:
        self.fn, self.expected_s, self.last = fn, expected_s, last
        self.limit_s = limit_s if limit_s is not None else 3 * expected_s + 60


#: name -> the job (the function that runs the process; its expected length: the longest go first)
JOBS: dict[str, Job] = {}


def job(
    name: str, expected_s: float, limit_s: float | None = None
) -> Callable[[Callable[[Path], Any]], Callable[[Path], Any]]:
    def register(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        JOBS[name] = Job(fn, expected_s, limit_s)
        return fn

    return register


def mark_session() -> str:
    """Mark this session's processes: every child inherits the variable (Ray's daemons and workers
    too: they take their parent's environment). This process's own environment block keeps its start's."""
    os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)
    # Ray's workers set their process titles (`ray::...`) with setproctitle, which by default writes
    # over the environment's memory (/proc/PID/environ then reads empty): told not to, they keep it.
    os.environ.setdefault("SPT_NOENV", "1")
    return os.environ[SESSION_MARK]


def marked(mark: str, variables: tuple[str, ...] = (SESSION_MARK, OUTER_MARK)) -> list[int]:
    """The processes whose environment holds one of ``variables`` set to ``mark``: by default, this
    session's and those of a session it started (Linux's /proc; elsewhere none)."""
    needles = {f"{variable}={mark}".encode() for variable in variables}
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needles & set((entry / "environ").read_bytes().split(b"\0")) and int(entry.name) != os.getpid():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def end_marked(mark: str, grace_s: float = 5.0, variables: tuple[str, ...] = (SESSION_MARK, OUTER_MARK)) -> list[int]:
    """End the processes marked ``mark`` (in one of ``variables``): SIGTERM, then SIGKILL what is left
    after ``grace_s``."""
    pids = marked(mark, variables)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [pid for pid in pids if _alive(pid)]
        if not pids:
            break
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; its parent has not collected it yet


class Lane:
    def __init__(self) -> None:
        self.futures: dict[str, Future] = {}
        self.started: dict[str, float] = {}
        self.took: dict[str, float] = {}
        self.root: Path | None = None
        self.closing = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, names: list[str]) -> None:
        """Run the named jobs one after another, the longest first, on a daemon thread."""
        if not names:
            return
        self.root = Path(tempfile.mkdtemp(prefix="rm-lane-", dir="/tmp"))  # short: Ray's socket paths
        order = sorted(set(names), key=run_order)
        self.futures = {name: Future() for name in order}
        self.thread = threading.Thread(target=self._run, args=(order,), name="raymodel-test-lane", daemon=True)
        self.thread.start()

    def _run(self, order: list[str]) -> None:
        assert self.root is not None
        for name in order:
            future = self.futures[name]
            if self.closing.is_set():
                future.set_exception(RuntimeError(f"the session ended before the lane's job {name!r} started"))
                continue
            began = self.started[name] = time.monotonic()
            try:
                scratch = self.root / name
                scratch.mkdir()
                future.set_result(JOBS[name].fn(scratch))
            except BaseException as exc:  # noqa: BLE001 - the test re-raises it
                future.set_exception(exc)
            finally:
                self.took[name] = time.monotonic() - began

    def result(self, name: str) -> Any:
        """What the job returned (waiting for it, within its limit from its start), or its exception."""
        if name not in self.futures:
            raise LookupError(f"the lane has no job {name!r}: mark its test @pytest.mark.lane({name!r})")
        future, limit = self.futures[name], JOBS[name].limit_s
        asked = time.monotonic()  # the lane's tests run last: from now on the lane has the machine
        while True:
            try:
                return future.result(timeout=1.0)
            except FutureTimeout:
                began = self.started.get(name)
                if began is not None and time.monotonic() - max(began, asked) > limit:
                    raise TimeoutError(
                        f"the lane's job {name!r} has run {time.monotonic() - began:.0f} s, {limit:.0f} s past "
                        f"its start or the wait for it, its limit (it is expected to take "
                        f"{JOBS[name].expected_s:.0f} s); its processes end with the session"
                    ) from None
                if began is None and not (self.thread and self.thread.is_alive()):
                    raise RuntimeError(f"the lane ended before its job {name!r} started") from None

    def close(self) -> list[int]:
        """End what the session left running (the lane's jobs, whatever else it started), then remove
        the lane's folders; returns the processes that would not end."""
        self.closing.set()
        left = end_marked(os.environ[SESSION_MARK]) if SESSION_MARK in os.environ else []
        if self.thread is not None:
            self.thread.join(timeout=30)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        return left


LANE = Lane()


def run_order(name: str) -> tuple[bool, float, str]:
    """The lane's order of its jobs: the longest first (those marked ``last`` after the others)."""
    return (JOBS[name].last, -JOBS[name].expected_s, name)


# ---------------------------------------------------------------------------- the plugin's hooks
def pytest_configure(config: pytest.Config) -> None:
    mark_session()  # before anything starts a process: the session's processes carry its mark
    config.addinivalue_line("markers", "lane(name): checks what the background lane's job `name` returned (lane.py)")


@pytest.hookimpl(trylast=True)  # after `-k`, `-m` and `--deselect` have deselected theirs
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The selected tests of the lane go last, in the order their jobs run (so that each waits for its
    own job only, within pytest-timeout's limit, which each gets from its job's), and their jobs start
    now: only those of the tests that will run."""
    if config.option.collectonly:
        return
    import beside

    beside.take(config, items)  # the tests of a second session become the lane's last job's
    laned = [item for item in items if item.get_closest_marker("lane")]
    if not laned:
        return
    name = lambda item: item.get_closest_marker("lane").args[0]  # noqa: E731
    laned.sort(key=lambda item: run_order(name(item)))
    for item in laned:
        item.add_marker(pytest.mark.timeout(JOBS[name(item)].limit_s + 120))
    items[:] = [item for item in items if not item.get_closest_marker("lane")] + laned
    LANE.start([name(item) for item in laned])


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down (its Ray shut down)
def pytest_sessionfinish(session: pytest.Session) -> None:
    running = [name for name in LANE.started if name not in LANE.took]
    if LANE.thread is not None and running and all(JOBS[name].last for name in running):
        LANE.thread.join(timeout=60)  # the second session (tests/beside.py), its tests reported, ends its Ray
    if LANE.took:
        print("\nbackground lane: " + ", ".join(f"{name} {s:.0f} s" for name, s in LANE.took.items()))
    left = LANE.close()  # what the session left running ends here
    if left:
        print(f"\nprocesses of this session that would not end: {left}")


@pytest.fixture(scope="session")
def lane() -> Lane:
    """The background lane's results (``lane.result(name)``)."""
    return LANE
