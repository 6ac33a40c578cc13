"""The background lane: tests whose work is a process with a Ray cluster of its own (a chaos run, a
cluster that loses nodes, a head serving through HAProxy, the demo as a user runs it).

Such a process needs nothing of the test session's Ray, so it runs from the start of the session, one
at a time on a thread of its own, while the session's tests run, on the CPU they leave idle
(SCHED_IDLE); its test waits for what it returned and checks it. ``conftest.py`` starts the lane once
the tests are collected (only for the tests selected) and moves those tests to the end of the session,
by when their processes have ended.

A test module registers its process with ``@job("name")`` (a function of a scratch folder, returning
what the test checks) and marks its test ``@pytest.mark.lane("name")``; the test takes the ``lane``
fixture and calls ``lane.result("name")``, which re-raises whatever the process's function raised.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

#: name -> (the function that runs the process, its expected length in seconds: the longest go first)
JOBS: dict[str, tuple[Callable[[Path], Any], float]] = {}


def job(name: str, expected_s: float) -> Callable[[Callable[[Path], Any]], Callable[[Path], Any]]:
    def register(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        JOBS[name] = (fn, expected_s)
        return fn

    return register


class Lane:
    def __init__(self) -> None:
        self.futures: dict[str, Future] = {}
        self.took: dict[str, float] = {}
        self.root: Path | None = None

    def start(self, names: list[str]) -> None:
        """Run the named jobs one after another, the longest first, on a daemon thread."""
        self.root = Path(tempfile.mkdtemp(prefix="rm-lane-", dir="/tmp"))  # short: Ray's socket paths
        order = sorted(set(names), key=lambda n: -JOBS[n][1])
        self.futures = {name: Future() for name in order}
        threading.Thread(target=self._run, args=(order,), name="raymodel-test-lane", daemon=True).start()

    def _run(self, order: list[str]) -> None:
        assert self.root is not None
        # The lane takes only the CPU the session's tests leave idle: this thread, and every process
        # it starts (its Ray heads, their workers), run under Linux's SCHED_IDLE. Beside the lane at
        # normal priority the session's first test file took 474 to 512 s; alone, 267 s. (Linux only:
        # elsewhere the lane runs at the tests' priority.)
        if hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        for name in order:
            future = self.futures[name]
            began = time.monotonic()
            try:
                scratch = self.root / name
                scratch.mkdir()
                future.set_result(JOBS[name][0](scratch))
            except BaseException as exc:  # noqa: BLE001 - the test re-raises it
                future.set_exception(exc)
            finally:
                self.took[name] = time.monotonic() - began

    def result(self, name: str) -> Any:
        """What the job returned (waiting for it), or its exception."""
        if name not in self.futures:
            raise LookupError(f"the lane has no job {name!r}: mark its test @pytest.mark.lane({name!r})")
        return self.futures[name].result()

    def close(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


LANE = Lane()
