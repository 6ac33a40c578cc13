"""The background lane (tests/lane.py) in a pytest session of its own: a selection starts only the
lane jobs of the tests it selected, a job past its limit fails its test, and the session leaves no
process of its own behind, not even one its job daemonized."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import lane
from lane import marked

TESTS = str(Path(__file__).parent)

CONFTEST = """
import beside, lane

def pytest_configure(config):
    config.pluginmanager.register(lane, "raymodel-test-lane")
    config.pluginmanager.register(beside, "raymodel-test-beside")
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
    env.pop("PYTEST_ADDOPTS", None)  # and takes no option given to the outer one (a plugin, a report)
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
    left = marked(probe, ("LANE_PROBE",))
    assert left == [], f"processes the session left running: {left}"


def test_the_lanes_jobs_run_at_the_priority_of_the_session():
    """The lane's thread (and so what it starts) keeps the session's scheduling policy and nice value: a
    lower one starved the lane's clusters into failures (tests/lane.py)."""
    here = (os.sched_getscheduler(0), os.nice(0))
    lane.JOBS["priority-probe"] = lane.Job(lambda scratch: (os.sched_getscheduler(0), os.nice(0)), 1, 30)
    probe = lane.Lane()
    try:
        probe.start(["priority-probe"])
        assert probe.result("priority-probe") == here
    finally:
        del lane.JOBS["priority-probe"]
        if probe.thread is not None:  # not ``close``: that ends every process of the session
            probe.thread.join(timeout=30)
        if probe.root is not None:
            shutil.rmtree(probe.root)


BESIDE = """
import os
import pytest

pytestmark = pytest.mark.beside

@pytest.fixture(scope="module")
def pid():
    return os.getpid()

def test_passes(pid):
    print("printed beside")
    open("beside-ran", "w").close()
    assert pid == os.getpid() and os.environ.get("RAYMODEL_SERVE_PORT") not in (None, "8000"), "ran here"

def test_fails(pid):
    assert pid == 0, "failed beside"

def test_skips():
    pytest.skip("skipped beside")
"""

HERE = """
import os

def test_here():
    assert "RM_TEST_BESIDE_REPORTS" not in os.environ
"""

#: A test marked alone, in a module that runs here (collected first): it runs beside, after the
#: marked module's tests.
ALONE = """
import os
import pytest

@pytest.mark.beside
def test_alone():
    assert "RM_TEST_BESIDE_REPORTS" in os.environ, "ran here"
    assert os.path.exists("beside-ran"), "ran before the marked module's tests"
"""


def _inner(tmp_path: Path, *args: str, module: str = BESIDE, alone: bool = False, **env: str) -> str:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_beside.py").write_text(textwrap.dedent(module))
    (tmp_path / "test_here.py").write_text(textwrap.dedent(HERE))
    (tmp_path / "test_alone.py").unlink(missing_ok=True)
    if alone:
        (tmp_path / "test_alone.py").write_text(textwrap.dedent(ALONE))
    inner = {**os.environ, "PYTHONPATH": TESTS, **env}
    for name in ("RM_TEST_SESSION", "PYTEST_ADDOPTS", "RAYMODEL_SERVE_PORT"):
        inner.pop(name, None)
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", f"--junitxml={tmp_path / 'j.xml'}", *args],
        env=inner,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr  # test_fails failed, wherever it ran
    return ran.stdout + ran.stderr


def test_a_beside_module_runs_in_a_second_session_and_its_results_are_reported_here(tmp_path: Path):
    out = _inner(tmp_path, alone=True)
    assert "1 failed, 3 passed, 1 skipped" in out, out  # test_alone too: beside, after test_passes
    assert "AssertionError: failed beside" in out and "skipped beside" in out, out  # its traceback, its reason
    assert "printed beside" in out, out  # the passing test's output (-rA)
    assert (tmp_path / "t").exists() is False  # the second session's folders are the lane's, removed
    junit = (tmp_path / "j.xml").read_text()
    assert 'name="test_passes"' in junit and "failed beside" in junit, junit  # reported here as if run here
    # Only the beside module moves: alone, it runs here (no second session to start for it).
    alone = _inner(tmp_path, "test_beside.py")
    assert "2 failed, 1 skipped" in alone and "AssertionError: ran here" in alone, alone
    one = _inner(tmp_path, RM_TEST_ONE_SESSION="1")  # or when told to
    assert "2 failed, 1 passed, 1 skipped" in one and "AssertionError: ran here" in one, one


def test_a_second_session_that_dies_fails_the_tests_it_did_not_finish(tmp_path: Path):
    dies = "import os, pytest\npytestmark = pytest.mark.beside\n"
    dies += "def test_dies():\n    os._exit(3)\ndef test_after():\n    pass\n"
    out = _inner(tmp_path, module=dies)
    assert "1 passed, 2 errors" in out, out
    assert "ended (exit code 3) without finishing this test" in out, out
