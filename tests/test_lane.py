"""The background lane (tests/lane.py) in a pytest session of its own: a selection starts only the
lane jobs of the tests it selected, a job past its limit fails its test, and the session leaves no
process of its own behind, not even one its job daemonized."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import lane
from lane import marked

TESTS = str(Path(__file__).parent)

CONFTEST = """
import lane

def pytest_configure(config):
    config.pluginmanager.register(lane, "raymodel-test-lane")
"""

SESSION = """
import os, subprocess, sys
from pathlib import Path

import lane
import pytest

TOUCHED = Path(os.environ["LANE_TOUCHED"])

@lane.job("slow", expected_s=1, limit_s=3)
def _slow(scratch):
    TOUCHED.joinpath("slow").write_text("started")
    # a process that leaves its parent's group and session, as Ray's daemons do, and outlives its parent
    subprocess.run([sys.executable, "-c", "import os, subprocess, sys, time; os.setsid(); "
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True); "
                    "time.sleep(300)"])

@lane.job("never", expected_s=2)
def _never(scratch):
    TOUCHED.joinpath("never").write_text("started")

@pytest.mark.lane("slow")
def test_slow(lane):
    lane.result("slow")

@pytest.mark.lane("never")
def test_never(lane):
    lane.result("never")

def test_plain():
    assert True
"""


def test_a_selection_starts_only_its_lane_jobs_and_the_session_leaves_no_process_behind(tmp_path: Path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_session.py").write_text(textwrap.dedent(SESSION))
    touched = tmp_path / "touched"
    touched.mkdir()
    probe = uuid.uuid4().hex  # inherited by everything the inner session starts
    env = {**os.environ, "PYTHONPATH": TESTS, "LANE_TOUCHED": str(touched), "LANE_PROBE": probe}
    env.pop("RM_TEST_SESSION", None)  # the inner session marks its own
    began = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not never", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - began
    out = ran.stdout + ran.stderr
    assert ran.returncode == 1, out  # test_slow failed: its job ran past its limit
    assert "1 failed, 1 passed, 1 deselected" in out, out
    assert "the lane's job 'slow' has run" in out and "3 s past its start or the wait for it" in out, out
    assert sorted(os.listdir(touched)) == ["slow"], out  # the deselected test's job never started
    assert took < 60, (took, out)  # nobody waited for the job's 300 s
    left = marked(probe, "LANE_PROBE")
    assert left == [], f"processes the session left running: {left}"


def idle_of(pid: int) -> set[bool]:
    """For each thread of ``pid``: is it under SCHED_IDLE?"""
    return {os.sched_getscheduler(int(task.name)) == os.SCHED_IDLE for task in Path(f"/proc/{pid}/task").iterdir()}


def test_the_lane_is_idle_and_full_priority_starts_at_normal_priority_then_idles_what_it_started():
    """A thread made idle as the lane's is (SCHED_IDLE) starts idle processes; one started within
    ``full_priority`` runs at normal priority until the block ends, then idles, each of its threads."""
    if not hasattr(os, "SCHED_IDLE"):
        return  # Linux's; elsewhere the lane runs at normal priority
    mark = uuid.uuid4().hex
    env = {**os.environ, lane.SCRIPT_MARK: mark}
    sleeper = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    seen: dict[str, object] = {}

    def on_the_lane() -> None:
        lane.lower_this_thread()
        children = []
        try:
            children.append(subprocess.Popen([sys.executable, "-c", sleeper], env=env))
            with lane.full_priority(mark):
                children.append(subprocess.Popen([sys.executable, "-c", sleeper], env=env))
                time.sleep(0.5)  # its second thread has started
                seen["within"] = idle_of(children[1].pid)
            seen["after"] = idle_of(children[1].pid)
            seen["plain"] = idle_of(children[0].pid)
            seen["threads"] = len(list(Path(f"/proc/{children[1].pid}/task").iterdir()))
        finally:
            for child in children:
                child.kill()
                child.wait()

    thread = threading.Thread(target=on_the_lane)
    thread.start()
    thread.join(timeout=30)
    assert seen == {"within": {False}, "after": {True}, "plain": {True}, "threads": 2}
