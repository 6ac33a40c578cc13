"""Progressive delivery on the model server: rollouts that roll back or promote by themselves, driven
in the cluster (a detached controller actor), under real load (`wrk`, threads of clients) on real Ray
Serve over HTTP (HAProxy); and a route that autoscales."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import requests
from browser import ARTIFACTS, browse, chromium
from models import FlakyDigits, digits_version
from sklearn.datasets import load_digits
from traffic import Clients
from waiting import until

import raymodel as rm
from raymodel.exceptions import ServeError, SettingsError
from raymodel.serve._rollouts.rollout import check_steps

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import loadgen

#: Serve's waits (steps, delays, replicas seen down): in a second session, beside the others (tests/beside.py).
pytestmark = pytest.mark.beside

TESTS = str(Path(__file__).resolve().parent)
SMALL = {"ray_actor_options": {"num_cpus": 0.25}}


# ---------------------------------------------------------------- without a cluster
def test_a_guard_and_steps_are_checked_before_anything_starts():
    assert rm.Guard() == rm.Guard(max_error_rate=0.01, max_p99_ms=None, min_requests=100)
    assert rm.serve.Guard.coerce({"max_error_rate": 0.05}).max_error_rate == 0.05
    for bad, says in (
        ({"max_error_rate": 1.5}, "max_error_rate"),
        ({"max_error_rate": True}, "max_error_rate"),
        ({"max_p99_ms": 0}, "max_p99_ms"),
        ({"min_requests": 0}, "min_requests"),
        ({"min_requests": 2.5}, "min_requests"),
    ):
        with pytest.raises(SettingsError, match=says):
            rm.Guard(**bad)
    with pytest.raises(SettingsError, match="no field.*'max_errors'"):
        rm.serve.Guard.coerce({"max_errors": 1})
    assert check_steps([0.05, 0.25, 1], 60) == ((0.05, 0.25, 1.0), 60.0)
    for steps, step_s, says in (
        ((0.5, 0.25), 1, "must increase"),
        ((0.0, 1.0), 1, r"share in \(0, 1\]"),
        ((0.5, 1.5), 1, r"share in \(0, 1\]"),
        ("0.5,1", 1, "candidate's shares"),
        ((), 1, "candidate's shares"),
        ((0.5, 1.0), -1, "step_s"),
    ):
        with pytest.raises(SettingsError, match=says):
            check_steps(steps, step_s)


def test_the_controllers_threads_build_serve_configs_one_at_a_time():
    """Serve registers and unregisters a module with cloudpickle's one registry to build each deployment
    config: two rollout threads of the controller routing at once broke it ("... is not registered for
    pickle by value"; seen in a suite run: a good rollout stopped). Four threads route at once here."""
    from ray.serve._private.config import DeploymentConfig

    from raymodel.serve._rollouts.controller import RolloutController

    class Building:
        rollout_id = None

        def _set_split(self, split):
            pass

        def apply(self):
            for _ in range(100):
                DeploymentConfig()  # what `serve.deployment()` and `serve.run` build

    controller, failed = RolloutController(Building), []

    def route():
        try:
            controller._route(Building(), {"digits:1": 1.0}, None)
        except ValueError as exc:
            failed.append(exc)

    threads = [threading.Thread(target=route) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == []


# ---------------------------------------------------------------- on the session's Ray
@pytest.fixture(scope="module")
def registry(ray_session, tmp_path_factory):
    """``digits`` 1 (production, stable), 2 (candidate) and 3, and 4: a candidate failing a third of its requests."""
    saved = os.environ.get("RAYMODEL_REGISTRY")
    os.environ["RAYMODEL_REGISTRY"] = str(tmp_path_factory.mktemp("rollouts") / "registry")
    rm.registry.put(digits_version(1), "digits", alias="production")
    rm.registry.set_alias("digits", "stable", 1)
    rm.registry.put(digits_version(2), "digits", alias="candidate")
    rm.registry.put(digits_version(3), "digits")
    flaky = FlakyDigits(config={"seed": 0})
    flaky.ensure_setup()
    flaky.net.load_state_dict(rm.registry.get("digits", 1).net.state_dict())  # it answers as production does
    rm.registry.put(flaky, "digits", alias="flaky")
    X, _ = load_digits(return_X_y=True)
    yield {"X": (X / 16.0).astype(np.float32), "uri": os.environ["RAYMODEL_REGISTRY"]}
    if saved is None:
        os.environ.pop("RAYMODEL_REGISTRY", None)
    else:
        os.environ["RAYMODEL_REGISTRY"] = saved


@pytest.mark.integration
def test_a_candidate_failing_a_third_of_its_requests_is_rolled_back_within_one_step(registry):
    served = rm.Servable("digits@production", "/ro-bad", settings=SMALL).deploy()
    clients = Clients(served.url, {"pixels": registry["X"][:1].tolist()})
    try:
        guard = rm.Guard(max_error_rate=0.01, min_requests=20)
        rollout = served.rollout("digits@flaky", steps=(0.2, 0.5, 1.0), step_s=60, guard=guard)
        assert rollout.wait(timeout=60) == "rolled back"  # within the first step (60 s long)
        state = rollout.state()
        assert state["step"] == 1 and state["split"] == {"digits@production": 1.0}
        assert "digits:4 failed" in state["reason"] and "over max_error_rate 1.0%" in state["reason"], state
        assert "serves digits:1 again, no alias moved" in state["reason"]
        ended = time.monotonic()
        time.sleep(2)
    finally:
        answers = clients.stop()
        served.shutdown()
    assert rm.registry.show("digits", "production").version == 1  # production untouched
    later = [(status, label) for t, status, label in answers if t > ended + 0.5]
    assert len(later) > 20 and set(later) == {(200, "digits:1")}, collections.Counter(later)
    during = collections.Counter((status, label) for t, status, label in answers if t <= ended)
    assert during[(500, "digits:4")] > 0 and (500, "digits:1") not in during  # only the candidate failed
    _dashboard_shows(rollout.id)


def _dashboard_shows(rollout_id: str) -> None:
    """The dashboard's routes view (headless chromium) lists the rollout: step, shares, guard, figures."""
    import re

    from s3server import free_port

    browser = chromium()
    base, token = rm.dashboard(port=free_port()).split("/?token=")
    page = f"{base}/?token={token}#/routes"
    dom = browse(browser, page)
    row = re.search(r'<table class="rollouts">.*?</table>', dom, re.S)
    assert row, dom[-3000:]
    text = row.group(0)
    assert "<code>/ro-bad</code>" in text and "<code>digits:1</code> → <code>digits:4</code>" in text
    assert '<span class="status ROLLED_BACK">rolled back</span>' in text and ">1/3<" in text
    assert "digits@production 100%" in text and "errors ≤ 1.0%, 20 requests a step" in text
    assert re.search(r"\d+ requests, \d+ failed \(\d+\.\d%\)", text) and "rolled back at step 1 (20%)" in text
    ARTIFACTS.mkdir(exist_ok=True)
    browse(browser, page, f"--screenshot={ARTIFACTS / 'routes_rollouts.png'}", "--window-size=1280,900")


@pytest.mark.integration
def test_a_good_candidate_is_promoted_through_three_steps_with_no_failed_request(registry):
    served = rm.Servable("digits@stable", "/ro-good", settings=SMALL).deploy()
    body = {"pixels": registry["X"][:1].tolist()}
    done: dict = {}
    stop = threading.Event()
    load = threading.Thread(
        target=lambda: done.update(loadgen.wrk(served.url, body, connections=4, seconds=60, stop=stop))
    )
    load.start()
    try:
        time.sleep(1)
        guard = rm.Guard(max_error_rate=0.0, min_requests=20)
        rollout = served.rollout("digits@candidate", steps=(0.1, 0.5, 1.0), step_s=2, guard=guard)
        with pytest.raises(ServeError, match="is being rolled out"):
            served.set_split({"digits@stable": 0.5, "digits@candidate": 0.5})
        with pytest.raises(ServeError, match="is being rolled out already"):
            served.rollout("digits:3", steps=(1.0,), step_s=0)
        shares = set()
        while rollout.status == "running":
            shares.add(tuple(sorted(rollout.state()["split"].items())))
            time.sleep(0.2)
        time.sleep(1)  # the promoted route under load too
    finally:
        stop.set()
        load.join()
    try:
        assert rollout.status == "promoted", rollout.reason
        assert "promoted after 3 steps" in rollout.reason and "digits@stable now names digits:2" in rollout.reason
        assert (("digits:2", 0.1), ("digits@stable", 0.9)) in shares and (("digits:2", 1.0),) in shares
        assert rm.registry.show("digits", "stable").version == 2  # the alias moved
        assert done["requests"] > 200 and done["non_2xx"] == 0 and done["socket_errors"] == 0, done
        info = requests.get(served.url + "/info", timeout=30).json()
        assert info["split"] == {"digits@stable": 1.0} and info["serving"] == "digits:2" and info["rollout"] is None
        with pytest.raises(ServeError, match="serves digits:2 already|names digits:2, the version"):
            served.rollout("digits@candidate", steps=(1.0,), step_s=0)
    finally:
        served.shutdown()
        rm.registry.set_alias("digits", "stable", 1)


@pytest.mark.integration
def test_a_rollout_goes_on_after_the_process_that_started_it_exits(registry):
    served = rm.Servable("digits:1", "/ro-cli", settings=SMALL).deploy()
    clients = Clients(served.url, {"pixels": registry["X"][:1].tolist()}, n=2)
    began, events = time.monotonic(), {}
    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cli = [sys.executable, "-m", "raymodel.cli"]
    try:
        bad = subprocess.run(
            [*cli, "serve", "rollout", "/ro-cli", "digits:3", "--steps", "0.5,0.2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert bad.returncode == 1 and "`steps` must increase" in bad.stderr, bad.stderr
        command = [*cli, "serve", "rollout", "/ro-cli", "digits:3", "--steps", "0.5,1", "--step-s", "1"]
        command += ["--min-requests", "10", "--max-error-rate", "0.05"]
        events["rollout asked"] = time.monotonic() - began
        started = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stderr[-3000:]
        events["rollout started"] = time.monotonic() - began
        assert "/ro-cli digits:1 -> digits:3 in steps 0.5,1" in started.stdout, started.stdout
        (rollout,) = [r for r in rm.serve.rollouts() if r.state()["route"] == "/ro-cli"]  # the caller has exited
        assert rollout.wait(timeout=90) == "promoted", rollout.reason
        events["promoted"] = time.monotonic() - began
        assert "`/ro-cli` serves digits:3 (no alias to move)" in rollout.reason
        listed = subprocess.run([*cli, "serve", "rollouts"], env=env, capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0 and f"{rollout.id}  /ro-cli  digits:1 -> digits:3  promoted" in listed.stdout
        until(lambda: clients.answers and clients.answers[-1][2] == "digits:3")
    finally:
        answers = clients.stop()
        served.shutdown()
    failed = [(round(t - began, 2), status, version) for t, status, version in answers if status != 200]
    assert not failed, (failed[:10], events, len(answers))  # when, against the rollout's steps


@pytest.mark.integration
def test_a_split_route_scales_up_under_load_and_back_down_without_a_failed_request(registry):
    """Serve decides from what replicas report (HAProxy does not count requests for it): under 16
    connections a second replica starts and answers through HAProxy, with no failed request; when the
    load stops one goes while a client of one request at a time sees only 200s; the one replica left
    serves both versions. (A route of a model instance takes the same deployment options.)"""
    from ray import serve

    settings = {
        "ray_actor_options": {"num_cpus": 0.25},
        "num_replicas": "auto",
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 2,
        "upscale_delay_s": 0,
        "downscale_delay_s": 2,
        "look_back_period_s": 2,  # the load that stopped leaves Serve's average within 2 s, not 30
    }
    served = rm.Servable({"digits@production": 0.5, "digits@candidate": 0.5}, "/scaled", settings=settings).deploy()

    def replicas() -> int:
        (deployment,) = serve.status().applications[served.name].deployments.values()
        states = deployment.replica_states.items()
        return sum(n for state, n in states if str(getattr(state, "value", state)) == "RUNNING")

    try:
        assert replicas() == 1
        body = {"pixels": registry["X"][:1].tolist()}
        stop = threading.Event()
        done: dict = {}
        load = threading.Thread(
            target=lambda: done.update(loadgen.wrk(served.url, body, connections=16, seconds=90, stop=stop))
        )
        load.start()
        try:
            until(lambda: replicas() == 2, timeout=60)
            # Serve counts the new replica RUNNING before HAProxy's reloaded backend sends it requests (a
            # clean-clone run's 20 requests right then all went to the first): ask until both answered.
            pids: set[int] = set()
            deadline = time.monotonic() + 30
            while len(pids) < 2 and time.monotonic() < deadline:
                pids.add(requests.get(served.url + "/info", timeout=10).json()["replica_pid"])
        finally:
            stop.set()
            load.join()
        assert len(pids) == 2 and done["non_2xx"] + done["socket_errors"] == 0 and done["requests"] > 1000, (
            pids,
            done,
        )
        statuses = []  # a client of one request at a time while the idle replica is removed, and after
        began = time.monotonic()
        while replicas() > 1 or len(statuses) < 20:  # back down once the load is gone
            assert time.monotonic() - began < 60, f"still {replicas()} replicas 60 s after the load stopped"
            statuses.append(requests.post(served.url, json=body, timeout=10).status_code)
            time.sleep(0.2)
        statuses += [requests.post(served.url, json=body, timeout=10).status_code for _ in range(20)]
        assert set(statuses) == {200}, statuses
        labels = collections.Counter(
            requests.post(served.url, json=body, headers={"x-raymodel-key": f"k{i}"}, timeout=10).headers[
                "x-raymodel-model"
            ]
            for i in range(200)
        )
        assert set(labels) == {"digits:1", "digits:2"}  # the one replica left serves both versions
    finally:
        served.shutdown()
