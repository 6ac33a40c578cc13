"""A replica killed under load: the route keeps answering, and is back to two replicas within 30 s.
Autoscaling behind HAProxy: load adds a replica, its end removes it, and no request fails either way.

Real parts only: Ray Serve with its HAProxy ingress (raymodel's default), `wrk` as the
load, SIGKILL on the replica's process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from models import DigitsNet

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import loadgen

pytestmark = pytest.mark.integration
CONNECTIONS, PROBES = 16, 4


def _replica_pids(url: str, tries: int = 10) -> set[int]:
    """The pids that answer ``GET <route>/info`` (HAProxy balances them over the replicas)."""
    return {requests.get(url + "/info", timeout=10).json()["replica_pid"] for _ in range(tries)}


def _both_answering(url: str, gone: int | None, within_s: float) -> tuple[set[int], float]:
    """Wait until two replicas answer (and not ``gone``); the pids and how long it took."""
    began = time.monotonic()
    while True:
        pids = _replica_pids(url)
        if len(pids) == 2 and gone not in pids:
            return pids, time.monotonic() - began
        assert time.monotonic() - began < within_s, f"only {pids} answer after {within_s} s (gone: {gone})"
        time.sleep(0.5)


def test_killing_a_replica_under_load_fails_at_most_its_requests_in_flight(ray_session, digits):
    if loadgen.available() is None:
        pytest.skip("wrk is not installed (apt-get install wrk; `make test` installs it where it can)")
    X, _ = digits
    model = DigitsNet(config={"hidden": 16})
    model.ensure_setup()
    app = model.serve("/faults", settings={"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.25}})
    try:
        body = {"pixels": X[:1].tolist()}
        info = requests.get(app.url + "/info", timeout=10).json()
        assert info["ingress"] == "haproxy" and info["torch_threads"] == 1, info
        before, _ = _both_answering(app.url, None, 20)  # HAProxy takes in a new replica on its next reload

        load: dict = {}
        wrk = threading.Thread(
            target=lambda: load.update(loadgen.wrk(app.url, body, connections=CONNECTIONS, seconds=14))
        )
        answers: list[tuple[int, str, str, float]] = []  # status (-1: no answer), content type, body, seconds
        stop = time.monotonic() + 13

        def probe() -> None:  # what wrk does not show: each failure's body, and how long it took
            with requests.Session() as session:
                while time.monotonic() < stop:
                    began = time.monotonic()
                    try:
                        r = session.post(app.url, json=body, timeout=10)
                        answers.append(
                            (r.status_code, r.headers.get("content-type", ""), r.text, time.monotonic() - began)
                        )
                    except requests.RequestException as exc:
                        answers.append((-1, "", repr(exc), time.monotonic() - began))

        probes = [threading.Thread(target=probe) for _ in range(PROBES)]
        for thread in [wrk, *probes]:
            thread.start()
        time.sleep(3)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        _, recovered_s = _both_answering(app.url, victim, 30)  # full capacity: the survivor and a new one
        for thread in [wrk, *probes]:
            thread.join()
    finally:
        app.shutdown()

    failed = [a for a in answers if a[0] != 200]
    in_flight = CONNECTIONS + PROBES  # an upper bound of the requests the dead replica held
    assert load["non_2xx"] + load["socket_errors"] + len(failed) <= in_flight, (load, failed)
    assert load["timeouts"] == 0 and max(a[3] for a in answers) < 5, "a request hung"
    for status, content_type, text, _ in failed:
        # an answer cut off mid-body has no status to check; every answer that came is a JSON 5xx
        assert status == -1 or (status >= 500 and content_type.startswith("application/json") and '"error"' in text), (
            status,
            content_type,
            text,
        )
    assert load["requests"] > 1000 and len(answers) > 200, (load, len(answers))
    print(f"recovered in {recovered_s:.1f} s; wrk {load}; probe failures {failed}")


def test_autoscaling_behind_haproxy_adds_and_removes_replicas_without_failures(ray_session, digits):
    """Serve decides from what replicas report (HAProxy does not count requests for it): under
    16 connections a second replica starts and takes requests; when the load stops, one goes."""
    from ray import serve

    if loadgen.available() is None:
        pytest.skip("wrk is not installed (apt-get install wrk; `make test` installs it where it can)")
    X, _ = digits
    model = DigitsNet(config={"hidden": 16})
    model.ensure_setup()
    app = model.serve(
        "/scaled",
        settings={
            "num_replicas": "auto",
            "min_replicas": 1,
            "max_replicas": 2,
            "target_ongoing_requests": 2,
            "upscale_delay_s": 1,
            "downscale_delay_s": 2,
            "ray_actor_options": {"num_cpus": 0.25},
        },
    )

    def states() -> dict[str, int]:
        return serve.status().applications["scaled"].deployments["scaled-model"].replica_states

    def running() -> int:
        return states().get("RUNNING", 0)

    enough = threading.Event()  # wrk runs until the second replica has answered for a few seconds
    try:
        assert running() == 1
        body = {"pixels": X[:1].tolist()}
        load: dict = {}
        wrk = threading.Thread(
            target=lambda: load.update(loadgen.wrk(app.url, body, connections=CONNECTIONS, seconds=60, stop=enough))
        )
        wrk.start()
        began = time.monotonic()
        pids: set[int] = set()
        # Replicas push their load every 10 s (Serve's default), and the new one imports torch on a
        # busy machine: the decision plus the start can take ~25 s.
        while len(pids) < 2:  # the new replica answers through HAProxy, not only runs
            assert time.monotonic() - began < 50, f"replicas {states()} after 50 s under load"
            pids |= _replica_pids(app.url, tries=4)
            time.sleep(0.5)
        scaled_s = time.monotonic() - began
        time.sleep(3)
        enough.set()
        wrk.join()
        assert load["non_2xx"] + load["socket_errors"] == 0 and load["requests"] > 1000, load

        statuses = []  # a client of one request at a time while the idle replica is removed
        began = time.monotonic()
        while running() > 1 or len(statuses) < 20:
            assert time.monotonic() - began < 40, f"still {running()} replicas 40 s after the load stopped"
            statuses.append(requests.post(app.url, json=body, timeout=10).status_code)
            time.sleep(0.2)
        for _ in range(20):  # and after it went
            statuses.append(requests.post(app.url, json=body, timeout=10).status_code)
        assert set(statuses) == {200}, statuses
        print(f"second replica answered after {scaled_s:.1f} s of load; wrk {load}")
    finally:
        enough.set()
        app.shutdown()
