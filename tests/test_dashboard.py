"""The dashboard in a real browser (Debian's chromium, headless) against real jobs on the session's Ray."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import requests
from browser import ARTIFACTS, browse, chromium
from models import TinyNet

import raymodel as rm


def _points(dom: str, series: str) -> int:
    found = re.search(rf'<path class="curve" data-series="{series}" data-points="(\d+)" d="M[\d.,L]+"', dom)
    assert found, f"no drawn `{series}` curve in the page"
    return int(found.group(1))


@pytest.mark.integration
@pytest.mark.beside  # mostly waits (a browser, a job's epochs): the second session (tests/beside.py)
def test_the_dashboard_shows_a_running_job_its_growing_curves_and_the_registry(ray_session, tiny_data, registry):
    from s3server import free_port

    browser = chromium()
    url = rm.dashboard(port=free_port())
    base, token = url.split("/?token=")
    assert base.startswith("http://127.0.0.1:") and rm.dashboard(port=int(base.rsplit(":", 1)[1])) == url
    job = TinyNet().train({"num_workers": 1, "num_epochs": 5000, "progress": False}, data=tiny_data, wait=False)
    try:
        for row in job.stream():
            if row["epoch"] >= 3:
                break
        ARTIFACTS.mkdir(exist_ok=True)
        listing = browse(browser, f"{base}/#/jobs")
        row = re.search(rf'<tr data-job="{job.id}">(.*?)</tr>', listing, re.S)
        assert row and '<span class="status RUNNING">' in row.group(1) and "<td>1 CPU</td>" in row.group(1)
        assert re.search(r'<td class="eta">ends in ~\d+ s</td>', row.group(1))  # its ETA, from its epoch times
        held = requests.get(f"{base}/api/resources", timeout=30).json()
        assert {"id": job.id, "kind": "train", "resources": {"CPU": 1.0}} in held["jobs"]
        (pool,) = held["pools"]  # the job runs on a pool of the training server
        assert (pool["state"], pool["job"], pool["workers"], pool["resources"]) == ("busy", job.id, 1, {"CPU": 1.0})
        shown = browse(browser, f"{base}/#/resources")
        assert pool["id"] in shown and "torch/1x[CPU=1]" in shown and "busy:" in shown
        page = f"{base}/?token={token}#/jobs/{job.id}"
        first = browse(browser, page)
        assert f'<span class="job-id">{job.id}</span> <span class="status RUNNING">' in first
        before = _points(first, "loss")
        assert before >= 3 and _points(first, "val_acc") >= 3
        shown = len(job.history())
        while len(job.history()) < shown + 3:  # more epochs end...
            time.sleep(0.2)
        after = _points(browse(browser, page), "loss")
        assert after > before, f"the curve did not gain points ({before} -> {after})"
        browse(browser, page, "--window-size=1280,900", f"--screenshot={ARTIFACTS / 'dashboard-job.png'}")
        assert (ARTIFACTS / "dashboard-job.png").stat().st_size > 10_000

        # A change from the job page's form goes through the same API: guarded, checked, then applied.
        update, auth = f"{base}/api/jobs/{job.id}/update", {"X-Raymodel-Token": token}
        assert 'form class="update"' in first
        assert requests.post(update, json={"config": {"lr": 0.01}}, timeout=10).status_code == 401
        bad = requests.post(update, json={"settings": {"batch_size": 2}}, headers=auth, timeout=10)
        assert bad.status_code == 400 and "`batch_size`" in bad.json()["error"]
        assert requests.post(update, json={"config": {"lr": 0.01}}, headers=auth, timeout=10).status_code == 200
        while job.changes[0]["epoch"] is None:  # applied at the next epoch boundary
            time.sleep(0.1)
        changed = browse(browser, page)
        assert "<h2>Changes</h2>" in changed and "<code>lr=0.01</code>" in changed

        stop = f"{base}/api/jobs/{job.id}/stop"
        assert requests.post(stop, timeout=10).status_code == 401  # read-only without the token
        assert requests.post(stop, headers={"X-Raymodel-Token": "wrong"}, timeout=10).status_code == 401
        assert job.status == "RUNNING"
        assert requests.post(stop, headers={"X-Raymodel-Token": token}, timeout=10).status_code == 200
        result = job.wait(timeout=120)
    finally:
        job.stop()
    assert job.status == "STOPPED"
    resources = requests.get(f"{base}/api/resources", timeout=30).json()
    assert resources["cluster"]["CPU"]["total"] == 2.0

    registry.put(result, "dash-digits", alias="production")
    browse(browser, f"{base}/#/models", "--window-size=1280,700", f"--screenshot={ARTIFACTS / 'dashboard-models.png'}")
    models = browse(browser, f"{base}/#/models")
    assert '<h2 class="model-key">dash-digits</h2>' in models and "@production" in models
    assert f'href="#/jobs/{job.id}"' in models  # lineage: the job that produced the version
    browse(browser, f"{base}/#/jobs", "--window-size=1280,500", f"--screenshot={ARTIFACTS / 'dashboard-jobs.png'}")


def test_a_tune_jobs_trials_best_and_early_stops_are_worked_out_from_its_record():
    from raymodel.web._api import _trials

    record = {
        "metric": "val_loss",
        "mode": "min",
        "epochs": 4,
        "result": None,
        "trials": {
            "a": {"config": {"lr": 0.1}, "status": "TERMINATED"},
            "b": {"config": {"lr": 0.01}, "status": "RUNNING"},
        },
        "history": [
            {"trial_id": "a", "epoch": 1, "val_loss": 0.9},
            {"trial_id": "b", "epoch": 1, "val_loss": 0.8},
            {"trial_id": "b", "epoch": 2, "val_loss": 0.5},
            {"trial_id": "a", "epoch": 2, "val_loss": 0.7},
        ],
    }
    trials, best = _trials(record)
    assert best == "b"  # the lowest last val_loss
    by_id = {t["trial_id"]: t for t in trials}
    assert by_id["a"]["stopped_early"] and not by_id["b"]["stopped_early"]  # ended at 2 of 4 epochs; still running
    assert by_id["a"]["epochs"] == 2 and by_id["b"]["metric"] == 0.5 and by_id["a"]["config"] == {"lr": 0.1}
    record["result"] = {"best_trial_id": "a"}  # once the job ended, Tune's own choice wins
    assert _trials(record)[1] == "a"


def test_a_taken_or_bad_port_is_a_clear_error_before_anything_starts():
    import socket

    from raymodel.exceptions import SettingsError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SettingsError, match=f"cannot listen on 127.0.0.1:{port}.*another port"):
            rm.dashboard(port=port)
    with pytest.raises(SettingsError, match="`port` must be an integer from 1 to 65535"):
        rm.dashboard(port=70000)


#: A hook registered before ``rm.dashboard`` runs after the dashboard's own exit hook (``atexit`` runs the
#: last registered first): it sees whether the server's thread and port outlived it.
_AT_EXIT = """
import atexit, socket, sys, threading
import requests
import raymodel as rm

def seen():
    alive = [t.name for t in threading.enumerate() if t.name == "raymodel-dashboard" and t.is_alive()]
    with socket.socket() as probe:
        answers = probe.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0
    print("AT EXIT", alive, answers, flush=True)

atexit.register(seen)
rm.init()
url = rm.dashboard(port=int(sys.argv[1]))
browser = requests.Session()  # a page's keep-alive connection, still open at the exit
assert browser.get(url.split("/?")[0] + "/", timeout=60).status_code == 200
"""


@pytest.mark.integration
def test_a_process_with_the_dashboard_ends_it_at_exit_and_exits_cleanly(ray_session):
    """The server's daemon thread ran its event loop into the interpreter's teardown, where a timer of
    uvloop's crashed the process (a segmentation fault: status -11, one exit in three of such a script,
    every run of this module alone): it ends before the interpreter does."""
    from s3server import free_port

    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}  # joins this session's
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-c", _AT_EXIT, str(port)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "AT EXIT [] False" in done.stdout.splitlines(), done.stdout  # no thread left, the port closed
