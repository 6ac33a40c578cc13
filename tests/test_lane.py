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
    assert "the lane's job 'slow' has run" in out and "past its limit of 3 s" in out, out
    assert sorted(os.listdir(touched)) == ["slow"], out  # the deselected test's job never started
    assert took < 60, (took, out)  # nobody waited for the job's 300 s
    left = marked(probe, "LANE_PROBE")
    assert left == [], f"processes the session left running: {left}"


def test_full_priority_starts_at_normal_priority_and_puts_what_it_started_back_on_idle():
    """On a SCHED_IDLE thread (the lane's), a process started within ``full_priority`` runs at normal
    priority (SCHED_OTHER) until the block ends, then idles again, each of its threads."""
    if not hasattr(os, "SCHED_IDLE"):
        return  # Linux's policy; elsewhere the lane runs at normal priority
    mark = uuid.uuid4().hex
    env = {**os.environ, lane.SCRIPT_MARK: mark}
    seen: dict[str, object] = {}

    def on_the_lane() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        child = None
        try:
            with lane.full_priority(mark):
                script = (
                    "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
                )
                child = subprocess.Popen([sys.executable, "-c", script], env=env)
                time.sleep(0.5)  # its second thread has started
                seen["within"] = {os.sched_getscheduler(int(t.name)) for t in Path(f"/proc/{child.pid}/task").iterdir()}
            seen["after"] = {os.sched_getscheduler(int(t.name)) for t in Path(f"/proc/{child.pid}/task").iterdir()}
            seen["threads"] = len(list(Path(f"/proc/{child.pid}/task").iterdir()))
            seen["lane"] = os.sched_getscheduler(0)
        finally:
            if child is not None:
                child.kill()
                child.wait()

    thread = threading.Thread(target=on_the_lane)
    thread.start()
    thread.join(timeout=30)
    assert seen == {"within": {os.SCHED_OTHER}, "after": {os.SCHED_IDLE}, "threads": 2, "lane": os.SCHED_IDLE}
