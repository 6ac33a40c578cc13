"""The model server: registry versions behind one route (weighted split, shadow, multiplexed), per-version
figures, and training by reference. Real Ray Serve over HTTP on raymodel's default ingress (HAProxy), a
real `wrk`, Debian's chromium for the dashboard, the `raymodel` command in a subprocess."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
from browser import ARTIFACTS, browse, chromium
from models import DigitsData, DigitsNet, digits_version
from ray import serve
from sklearn.datasets import load_digits
from waiting import until

import raymodel as rm
from raymodel.exceptions import DataError, RegistryError, SettingsError
from raymodel.jobs._from_registry import check_register, load_data, split_sets
from raymodel.serve import _driver as serve_driver
from raymodel.serve._routes.traffic import VersionStats, check_split, compare, pick, point

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import loadgen

#: Serve's waits (steps, delays, replicas seen down): in a second session, beside the others (tests/beside.py).
pytestmark = pytest.mark.beside

TESTS = str(Path(__file__).resolve().parent)
SMALL = {"ray_actor_options": {"num_cpus": 0.25}}  # three routes' replicas fit beside the session's jobs


# ---------------------------------------------------------------- without a cluster
def test_a_split_is_checked_before_anything_serves_it():
    assert check_split({"digits@production": 0.9, "digits@candidate": 0.1}) == {
        "digits@production": 0.9,
        "digits@candidate": 0.1,
    }
    for bad, says in (
        ({"digits@production": 0.9, "digits@candidate": 0.2}, "sum to 1"),
        ({"digits@production": 1.1, "digits@candidate": -0.1}, "positive"),
        ({"digits@production": 0.5, "digits@candidate": True}, "positive"),
        ({}, "a dict of registry references"),
        ({"digits@": 1.0}, "not a registry reference"),
    ):
        with pytest.raises(SettingsError, match=says):
            check_split(bad)


def test_a_splits_keys_land_by_weight_and_each_stays_where_it_landed():
    shares = [("a", 0.9), ("b", 0.1)]
    landed = collections.Counter(pick(shares, point(f"user-{i}")) for i in range(20000))
    assert abs(landed["b"] / 20000 - 0.1) < 0.01
    # 1,000 sequential keys of the shapes clients send: each share of a rollout's steps within 3 points
    # of its weight (CRC-32 scaled gave the 10% share 6.4% of `user-0 ... user-999`)
    for shape in ("user-{}", "k{}", "customer_{}", "{}", "u{:06d}", "session/{}"):
        for weights in ((0.9, 0.1), (0.75, 0.25), (0.95, 0.05)):
            split = list(zip("ab", weights))
            b = sum(pick(split, point(shape.format(i))) == "b" for i in range(1000)) / 1000
            assert abs(b - weights[1]) <= 0.03, (shape, weights, b)
    assert {pick(shares, point("user-7")) for _ in range(50)} == {pick(shares, point("user-7"))}
    # a new split moves only the keys whose point changes share: 0.9/0.1 -> 0.5/0.5 keeps every "b"
    wider = [("a", 0.5), ("b", 0.5)]
    assert all(pick(wider, point(f"user-{i}")) == "b" for i in range(5000) if pick(shares, point(f"user-{i}")) == "b")


def test_a_shadows_answers_are_compared_by_their_decisions_and_numbers():
    assert compare({"digit": [3, 1]}, {"digit": [3, 1]}) == (True, [])
    assert compare({"digit": [3, 1]}, {"digit": [3, 2]})[0] is False
    agree, diffs = compare({"label": 2, "p": [0.25, 0.75]}, {"label": 2, "p": [0.5, 0.5]})
    assert agree and diffs == [0.25, 0.25]  # same class, different scores: agreement, and the difference
    assert compare([1.0, 2.0], [1.0, 2.0 + 1e-9])[0] and not compare([1.0], [1.5])[0]  # a regression: close
    assert compare({"digit": [1]}, {"digit": [1, 2]})[0] is False  # another shape
    stats = VersionStats()
    for latency in (0.010, 0.020, 0.030):
        stats.record("digits:1", latency, failed=False)
    stats.record("digits:2", 0.5, failed=True)
    stats.record_shadow("digits:3", "digits:1", True, [0.5], False)
    stats.record_shadow("digits:3", "digits:1", False, [1.5], False)
    stats.record_shadow("digits:3", "digits:1", None, [], True)
    summary = stats.summary()
    assert summary["versions"]["digits:1"]["requests"] == 3 and summary["versions"]["digits:1"]["p50_ms"] == 20.0
    assert summary["versions"]["digits:2"]["errors"] == 1
    assert summary["shadow"]["digits:3"] == {
        "answered": "digits:1",
        "sent": 3,
        "compared": 2,
        "agreement": 0.5,
        "mean_abs_diff": 1.0,
        "errors": 1,
    }


def test_following_an_alias_never_puts_back_the_split_a_reconfiguration_replaced(monkeypatch):
    """A replica follows its references every ``registry_poll_s``. A follow that begins while a new
    split loads its version waits for it and then follows the new split, not the one it read before
    the load (else a load that outlasts the poll puts the old split back, and a rollout's step is
    never taken)."""
    from types import SimpleNamespace

    from raymodel.registry import sources
    from raymodel.serve._routes.plan import RoutePlan
    from raymodel.serve._routes.server import RouteServer, _Route

    loading = threading.Event()

    def load(source: dict, version: int) -> str:
        if version == 2:
            loading.set()
            time.sleep(0.3)
        return f"bard:{version} loaded"

    monkeypatch.setattr(sources, "load", load)
    server = RouteServer.__new__(RouteServer)
    server.plan, server.loads, server._lock = RoutePlan("mem://"), 0, threading.Lock()
    aliases = {"production": 1}
    server.registry = SimpleNamespace(uri="mem://", resolve=lambda key, version: aliases.get(version, version))
    server.route = _Route([("bard@production", 1.0)], {"bard@production": "bard:1"}, {"bard:1": "bard:1 loaded"})
    new = [("bard@production", 0.5), ("bard:2", 0.5)]
    step = threading.Thread(target=server._apply, args=(new,))
    step.start()
    assert loading.wait(10)
    assert server._follow_once() == {}  # a follow during the load: it waits, then holds the new split
    step.join()
    assert server.route.shares == new and server.route.labels == {"bard@production": "bard:1", "bard:2": "bard:2"}
    assert server.loads == 1
    aliases["production"] = 2  # the alias moves: followed, the version already held
    assert server._follow_once() == {"bard@production": "bard:2"}
    assert server.route.models == {"bard:2": "bard:2 loaded"} and server.route.shares == new
    server.route = _Route([], {}, {})
    assert server._follow_once() == {}  # before Serve's first reconfiguration: nothing to follow


def test_a_routes_figures_are_its_requests_over_the_window_not_its_versions_worst():
    """The dashboard's route figures (``stats``): the requests answered within ``window_s`` (older
    ones left out), p50/p99 over all of them (not the slowest version's p50), and the mean size of the
    batches run in the window (not ``None``), for a split route and a multiplexed one alike."""
    import asyncio
    import collections
    from types import SimpleNamespace

    from raymodel.serve._replica.deployment import ModelReplica
    from raymodel.serve._routes.plan import RoutePlan
    from raymodel.serve._routes.server import RouteServer
    from raymodel.serve._routes.versions import ModelRouter

    now = time.time()
    stats = VersionStats()
    stats.started = now - 600
    stats.requests["digits:1"] = collections.deque([(now - 5, 0.010, False)] * 9 + [(now - 120, 0.900, False)] * 5)
    stats.requests["digits:2"] = collections.deque([(now - 5, 0.500, False)])
    batches = collections.deque([(now - 120, 16), (now - 3, 2), (now - 2, 4)])
    route = SimpleNamespace(labels={"digits@a": "digits:1", "digits@b": "digits:2"}, shares=[("digits@a", 0.9)])
    server = SimpleNamespace(
        figures=stats,
        batch_sizes=batches,
        info={"route": "/digits"},
        route=route,
        rollout=None,
        plan=RoutePlan("mem://"),
    )
    server._refs = lambda shares: RouteServer._refs(server, shares)
    router = SimpleNamespace(figures=stats, batches=batches, info={"route": "/digits"})
    for figures in (RouteServer.stats(server, 60.0), asyncio.run(ModelRouter.stats(router, 60.0))):
        assert figures["requests"] == 10 and figures["window_s"] == 60.0
        assert figures["p50_ms"] == 10.0 and figures["p99_ms"] == 500.0  # the slow version's p50 is 500
        assert figures["mean_batch_size"] == 3.0
        assert figures["versions"]["digits:1"]["requests"] == 9  # the per-version figures: the same window
    whole = RouteServer.stats(server, 300.0)
    assert whole["requests"] == 15 and whole["p50_ms"] == 10.0 and whole["mean_batch_size"] == 7.333
    one = SimpleNamespace(requests=collections.deque([(now - 1, 0.02), (now - 90, 0.2)]), batch_sizes=batches)
    one.info, one.started = {"route": "/one"}, now - 600
    one.model = SimpleNamespace(source={"checkpoint": "/runs/one/checkpoint_epoch_000003"})
    single = ModelReplica.stats(one, 60.0)
    assert single["requests"] == 1 and single["p50_ms"] == 20.0 and single["mean_batch_size"] == 3.0


def test_jobs_by_reference_refuse_bad_names_data_and_keys_before_anything_starts(tmp_path, monkeypatch, capsys):
    from raymodel.cli import main

    assert check_register("digits@candidate") == ("digits", "candidate") and check_register("digits") == (
        "digits",
        None,
    )
    with pytest.raises(SettingsError, match="KEY or KEY@ALIAS"):
        check_register("digits:4")
    with pytest.raises(DataError, match="package.module:OBJECT"):
        load_data("models.digits_data")
    with pytest.raises(DataError, match="has no `nothing`; it has: .*DigitsNet"):
        load_data("models:nothing")
    with pytest.raises(DataError, match="cannot import `no_such_module`"):
        load_data("no_such_module:data")
    assert type(load_data("models:digits_data")).__name__ == "DataSpec"  # a function there is called for the data
    assert type(load_data("models:DigitsData").module).__name__ == "DigitsData"  # a class, instantiated
    with pytest.raises(DataError, match=r"names the class `PathData`.*`PathData\(\)` failed: TypeError"):
        load_data("models:PathData")
    with pytest.raises(DataError, match=r"`setup\(self\)`|`setup\(\)` cannot take the config"):
        load_data("models:NoConfigData")
    with pytest.raises(DataError, match=r"the class `DigitsData`; a data module is an instance of it"):
        rm.data.resolve(DigitsData)
    assert split_sets({"num_epochs": 3, "lr": 0.1}, "train", {"lr": 0.01}) == ({"num_epochs": 3}, {"lr": 0.1})
    assert split_sets({"num_samples": 2, "train.num_workers": 2}, "tune", {})[0] == {
        "num_samples": 2,
        "train": {"num_workers": 2},
    }
    with pytest.raises(SettingsError, match="`batchsize` is neither a TrainSettings field nor a key"):
        split_sets({"batchsize": 3}, "train", {"lr": 0.01})
    monkeypatch.setenv("RAYMODEL_REGISTRY", str(tmp_path / "registry"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rm.registry.put(digits_version(1), "digits", alias="production")
    for args, says in (
        (["digits@nope", "--data", "models:digits_data"], "`digits` has no alias `nope`; aliases: production->1"),
        (["digits", "--data", "models:nothing"], "`models` has no `nothing`"),
        (["digits", "--data", "models:NoConfigData"], "cannot take the config"),
        (["digits", "--data", "models:digits_data", "--set", "batchsize=3"], "`batchsize` is neither"),
        (["digits", "--data", "models:digits_data", "--register", "digits:9"], "KEY or KEY@ALIAS"),
    ):
        assert main(["train", *args]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err  # one line, before any cluster is joined
    with pytest.raises(RegistryError, match="No model `iris`"):
        rm.jobs.submit("iris@production", "train", data="models:digits_data")
    with pytest.raises(SettingsError, match="not in the config of `digits:1`"):
        rm.jobs.submit("digits", "train", data="models:digits_data", config={"lr_typo": 1})


def test_a_route_of_several_versions_is_checked_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMODEL_REGISTRY", str(tmp_path / "registry"))
    rm.registry.put(digits_version(1), "digits", alias="production")
    rm.registry.put(digits_version(2), "digits", alias="candidate")
    for make, error, says in (
        (lambda: rm.Servable({"digits@production": 0.8, "digits@candidate": 0.1}, "/d"), SettingsError, "sum to 1"),
        (lambda: rm.Servable({"digits@production": 0.5, "digits@nope": 0.5}, "/d"), RegistryError, "no alias `nope`"),
        (
            lambda: rm.Servable("digits@production", "/d", shadow="digits@production"),
            SettingsError,
            "also in the split",
        ),
        (lambda: rm.Servable("digits@*", "/d", shadow="digits:1"), SettingsError, "has no shadow"),
        (lambda: rm.Servable("iris@*", "/d"), RegistryError, "No model `iris`"),
        (
            lambda: rm.Servable("digits:1", "/d", shadow="digits:2", shadow_fraction=0),
            SettingsError,
            "shadow_fraction",
        ),
        (
            lambda: rm.Servable(
                {"digits:1": 0.5, "digits:2": 0.5},
                "/d",
                shadow="digits@candidate",
                settings={"max_models_per_replica": 2},
            ),
            SettingsError,
            "max_models_per_replica=3",
        ),
    ):
        with pytest.raises(error, match=says):
            make()


def test_a_routes_serve_config_holds_its_plan_for_raymodels_builder_and_never_a_key(tmp_path, monkeypatch, capsys):
    """``rm.serve.config`` (and ``raymodel serve ... --config-out``) write Ray Serve's config file of a
    route: raymodel's builder, the route's plan as its ``args`` (checked against the registry first),
    the deployments' replicas and resources; keys as digests, or the variable that holds them."""
    import yaml

    from raymodel.cli import main as cli_main
    from raymodel.serve._replica.auth import digest

    registry = str(tmp_path / "registry")
    monkeypatch.setenv("RAYMODEL_REGISTRY", registry)
    for seed, alias in ((1, "production"), (2, "candidate"), (3, None)):
        rm.registry.put(digits_version(seed), "digits", alias=alias)
    split = {"digits@production": 0.9, "digits@candidate": 0.1}
    settings = {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.25}, "api_keys": ["key-one"], "port": 8123}
    path = tmp_path / "split.yaml"
    document = rm.serve.config(split, "/digits", shadow="digits:3", settings=settings, path=path)
    assert yaml.safe_load(path.read_text()) == document
    assert "key-one" not in path.read_text()
    (app,) = document["applications"]
    assert document["http_options"] == {"host": "0.0.0.0", "port": 8123}
    assert app["import_path"] == "raymodel.serve:route_application" and app["route_prefix"] == "/digits"
    assert app["args"] == {
        "route": "/digits",
        "registry": registry,
        "refs": list(split),
        "shadow": "digits:3",
        "shadow_fraction": 1.0,
        "settings": {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.25}, "api_keys": [digest("key-one")]},
    }
    (deployment,) = app["deployments"]
    assert deployment["name"] == f"{app['name']}-model" and deployment["num_replicas"] == 2
    assert deployment["ray_actor_options"] == {"num_cpus": 0.25}
    assert deployment["user_config"] == {"split": split, "rollout": None}  # the weights: moved in place
    # The builder makes the application `Servable(...).as_application()` makes (no Ray needed to build it).
    built = rm.serve.route_application(app["args"])
    same = rm.Servable(split, "/digits", shadow="digits:3", settings=settings).as_application()
    assert built._bound_deployment.version == same._bound_deployment.version
    # The command line: a split as REF=WEIGHT words; keys named by a variable stay a name (a Secret's there).
    monkeypatch.delenv("ROUTE_KEYS", raising=False)
    out = tmp_path / "cli.yaml"
    assert (
        cli_main(
            [
                "serve",
                "digits@production=0.9",
                "digits@candidate=0.1",
                "--shadow",
                "digits:3",
                "--route",
                "/digits",
                "--api-keys",
                "ROUTE_KEYS",
                "--config-out",
                str(out),
            ]
        )
        == 0
    )
    assert f"wrote {out}" in capsys.readouterr().out
    written = yaml.safe_load(out.read_text())["applications"][0]["args"]
    assert written["refs"] == list(split) and written["settings"]["api_keys"] == "ROUTE_KEYS"
    for bad, error, says in (
        ({"digits@production": 0.5, "digits@nope": 0.5}, RegistryError, "no alias `nope`"),
        (digits_version(1), SettingsError, "Register it first"),
    ):
        with pytest.raises(error, match=says):
            rm.serve.config(bad, "/digits", path=tmp_path / "bad.yaml")
    assert not (tmp_path / "bad.yaml").exists()
    unweighted = ["serve", "digits@production=0.9", "digits@candidate", "--config-out", str(tmp_path / "b.yaml")]
    assert cli_main(unweighted) == 1
    assert "`digits@candidate` has no weight" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="a `route` and one of `ref`, `refs`"):
        rm.serve.route_application({"split": split})
    with pytest.raises(SettingsError, match="two or more"):
        rm.serve.route_application({"route": "/digits", "refs": ["digits@production"]})


# ---------------------------------------------------------------- on the session's Ray
@pytest.fixture(scope="module")
def versions(ray_session, tmp_path_factory):
    """``digits`` 1 (production), 2 (candidate) and 3 in a registry of the module's own."""
    saved = os.environ.get("RAYMODEL_REGISTRY")
    os.environ["RAYMODEL_REGISTRY"] = str(tmp_path_factory.mktemp("model_server") / "registry")
    for seed, alias in ((1, "production"), (2, "candidate"), (3, None)):
        rm.registry.put(digits_version(seed), "digits", alias=alias)
    X, _ = load_digits(return_X_y=True)
    yield {"X": (X / 16.0).astype(np.float32), "local": {n: rm.registry.get("digits", n) for n in (1, 2, 3)}}
    if saved is None:
        os.environ.pop("RAYMODEL_REGISTRY", None)
    else:
        os.environ["RAYMODEL_REGISTRY"] = saved


@pytest.fixture(scope="module")
def split(versions):
    served = rm.Servable({"digits@production": 0.9, "digits@candidate": 0.1}, "/split", settings=SMALL).deploy()
    yield served
    served.shutdown()


def _post(session: requests.Session, url: str, body, **headers) -> requests.Response:
    return session.post(url, json=body, headers=headers, timeout=30)


def _many(url: str, bodies_and_headers, workers: int = 8) -> list[requests.Response]:
    local = threading.local()

    def one(item):
        if not hasattr(local, "session"):
            local.session = requests.Session()
        body, headers = item
        return _post(local.session, url, body, **headers)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, bodies_and_headers))


@pytest.mark.integration
def test_a_split_route_lands_keys_by_weight_sticks_and_changes_live_under_load(split, versions, monkeypatch):
    X, local = versions["X"], versions["local"]
    body = {"pixels": X[:2].tolist()}
    answers = _many(split.url, [(body, {"x-raymodel-key": f"user-{i}"}) for i in range(2000)])
    assert {a.status_code for a in answers} == {200}
    named = [a.headers["x-raymodel-model"] for a in answers]
    counts = collections.Counter(named)
    assert set(counts) == {"digits:1", "digits:2"} and abs(counts["digits:2"] / 2000 - 0.1) <= 0.03, counts
    for a, label in zip(answers[:50], named):  # each answer is the version it names
        assert a.json() == local[int(label.split(":")[1])].predict(body)
    with requests.Session() as s:
        for i in range(0, 2000, 97):  # the same key, the same version
            assert {
                _post(s, split.url, body, **{"x-raymodel-key": f"user-{i}"}).headers["x-raymodel-model"]
                for _ in range(3)
            } == {named[i]}
    info = requests.get(split.url + "/info", timeout=30).json()
    assert info["split"] == {"digits@production": 0.9, "digits@candidate": 0.1}
    assert info["versions"]["digits:2"]["requests"] >= counts["digits:2"] and info["versions"]["digits:1"]["p99_ms"] > 0
    pid = info["replica_pid"]
    with pytest.raises(SettingsError, match="sum to 1"):
        split.set_split({"digits@production": 0.5, "digits@candidate": 0.4})
    # set_split under a running wrk: nothing fails, nothing restarts
    done = {}
    load = threading.Thread(target=lambda: done.update(loadgen.wrk(split.url, body, connections=8, seconds=8)))
    load.start()
    time.sleep(3)
    split.set_split({"digits@production": 0.5, "digits@candidate": 0.5})
    load.join()
    assert done["requests"] > 100 and done["non_2xx"] == 0 and done["socket_errors"] == 0, done
    info = requests.get(split.url + "/info", timeout=30).json()
    assert info["split"] == {"digits@production": 0.5, "digits@candidate": 0.5}
    assert info["replica_pid"] == pid  # reconfigured in place, no replica restarted
    assert sorted(info["loaded"]) == ["digits:1", "digits:2"]
    again = _many(split.url, [(body, {"x-raymodel-key": f"user-{i}"}) for i in range(1000)])
    moved = [a.headers["x-raymodel-model"] for a in again]
    assert abs(moved.count("digits:2") / 1000 - 0.5) <= 0.05
    assert all(m == "digits:2" for m, before in zip(moved, named) if before == "digits:2")  # only 1 -> 2 moved
    # A replica Serve did not hand its split (seen once under load): set_split hands it over itself.
    # Here the replica is put back on the old split behind Serve's back, so Serve, whose user_config
    # is the split asked for already, changes nothing: only the hand-over can make set_split return.
    monkeypatch.setattr(serve_driver, "PUSH_AFTER_S", 1.0)
    handle = serve.get_app_handle(split.name)
    old = {"digits@production": 0.9, "digits@candidate": 0.1}
    handle.broadcast("take", {"split": old, "rollout": None}).results()
    assert requests.get(split.url + "/info", timeout=30).json()["split"] == old
    split.set_split({"digits@production": 0.5, "digits@candidate": 0.5})  # without the hand-over: 60 s, then an error
    info = requests.get(split.url + "/info", timeout=30).json()
    assert info["split"] == {"digits@production": 0.5, "digits@candidate": 0.5} and info["replica_pid"] == pid


@pytest.mark.integration
def test_rays_serve_deploy_of_a_routes_config_answers_as_the_route_does_and_a_new_split_moves_in_place(
    split, versions, tmp_path
):
    """The file ``rm.serve.config`` writes, deployed by Ray's own ``serve deploy`` (the dashboard's REST
    API, as a RayService's operator applies ``serveConfigV2``): the split lands each key on the version
    the same route made by ``rm.Servable(...).deploy()`` gives it, the shadow is compared, and the file
    deployed again with another split moves the traffic in the running replica."""
    import ray
    import yaml

    X, local = versions["X"], versions["local"]
    weights = {"digits@production": 0.9, "digits@candidate": 0.1}
    proxy = rm.ServeSettings()  # the session's Serve, running already: its HTTP options
    settings = {**SMALL, "host": proxy.host, "port": proxy.port}
    path = tmp_path / "serve.yaml"
    document = rm.serve.config(weights, "/from-config", shadow="digits:3", settings=settings, path=path)
    name = document["applications"][0]["name"]
    dashboard = "http://" + ray._private.worker.global_worker.node.address_info["webui_url"]

    def deploy() -> None:
        command = [str(Path(sys.executable).parent / "serve"), "deploy", str(path), "--address", dashboard]
        out = subprocess.run(command, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]

    deploy()
    url = f"http://{proxy.host}:{proxy.port}/from-config"
    try:
        until(lambda: _answers(url + "/info"), timeout=180)
        body = {"pixels": X[:2].tolist()}
        keys = [(body, {"x-raymodel-key": f"user-{i}"}) for i in range(1000)]
        before = requests.get(split.url + "/info", timeout=30).json()["split"]  # as earlier tests left it
        split.set_split(weights)  # the same route made by Servable, with this file's weights
        try:
            theirs = _many(split.url, keys)
        finally:
            split.set_split(before)
        answers = _many(url, keys)
        assert {a.status_code for a in answers} == {200}
        named = [a.headers["x-raymodel-model"] for a in answers]
        assert named == [a.headers["x-raymodel-model"] for a in theirs]  # each key, the same version
        assert abs(named.count("digits:2") / 1000 - 0.1) <= 0.03, collections.Counter(named)
        for a, label in zip(answers[:30], named):
            assert a.json() == local[int(label.split(":")[1])].predict(body)
        until(lambda: requests.get(url + "/info", timeout=30).json()["shadows"].get("digits:3", {}).get("compared"))
        info = requests.get(url + "/info", timeout=30).json()
        assert info["split"] == weights and info["shadows"]["digits:3"]["answered"] in ("digits:1", "digits:2")
        # A new split in the file (the deployment's user_config), deployed again: the same replica takes it.
        document["applications"][0]["deployments"][0]["user_config"]["split"] = {
            "digits@production": 0.5,
            "digits@candidate": 0.5,
        }
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        deploy()
        until(lambda: requests.get(url + "/info", timeout=30).json()["split"]["digits@candidate"] == 0.5, timeout=120)
        after = requests.get(url + "/info", timeout=30).json()
        assert after["replica_pid"] == info["replica_pid"]  # reconfigured in place, not restarted
        moved = [a.headers["x-raymodel-model"] for a in _many(url, keys)]
        assert abs(moved.count("digits:2") / 1000 - 0.5) <= 0.05
    finally:
        serve.delete(name)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.integration
def test_a_shadow_is_compared_with_the_answered_version_and_never_answers(versions):
    X, local = versions["X"], versions["local"]
    served = rm.Servable("digits@production", "/shadowed", shadow="digits@candidate", settings=SMALL).deploy()
    try:
        bodies = [{"pixels": X[i : i + 1].tolist()} for i in range(200)]
        answers = _many(served.url, [(b, {}) for b in bodies])
        assert {a.headers["x-raymodel-model"] for a in answers} == {"digits:1"}
        assert [a.json() for a in answers] == [local[1].predict(b) for b in bodies]  # production's answers only
        expected = sum(local[1].predict(b) == local[2].predict(b) for b in bodies) / len(bodies)
        url = served.url + "/info"
        until(lambda: requests.get(url, timeout=30).json()["shadows"].get("digits:2", {}).get("compared") == 200)
        shadow = requests.get(url, timeout=30).json()["shadows"]["digits:2"]
        assert shadow["answered"] == "digits:1" and shadow["errors"] == 0
        assert shadow["agreement"] == pytest.approx(expected, abs=1e-4), (shadow, expected)
        assert 0 < expected < 1  # the two versions disagree on some digits: the figure can tell
        _dashboard_shows(served, shadow, expected)
    finally:
        served.shutdown()


def _dashboard_shows(served, shadow, expected) -> None:
    """The dashboard's routes view (headless chromium) has a row per version and the shadow's agreement."""
    from s3server import free_port

    browser = chromium()
    base, token = rm.dashboard(port=free_port()).split("/?token=")
    page = f"{base}/?token={token}#/routes"
    dom = browse(browser, page)
    assert '<table class="versions">' in dom and "<code>/shadowed</code>" in dom
    row = re.search(
        r"<tr><td><code>digits:1</code></td><td>digits@production 100%</td>\s*<td class=\"num\">(\d+)</td>", dom
    )
    assert row and int(row.group(1)) >= 200, dom[-3000:]
    assert f"agreement {100 * expected:.1f}% of {shadow['compared']}" in dom and "shadow of digits:1" in dom
    ARTIFACTS.mkdir(exist_ok=True)
    browse(browser, page, f"--screenshot={ARTIFACTS / 'routes_versions.png'}", "--window-size=1280,800")


@pytest.mark.integration
def test_a_multiplexed_route_serves_versions_by_header_in_an_lru_of_two(versions):
    X, local = versions["X"], versions["local"]
    body = {"pixels": X[:3].tolist()}
    served = rm.Servable("digits@*", "/any", settings={**SMALL, "max_models_per_replica": 2}).deploy()
    try:
        with requests.Session() as s:
            for ref, label in (("digits:1", "digits:1"), ("digits@candidate", "digits:2"), ("digits:3", "digits:3")):
                answer = _post(s, served.url, body, **{"x-raymodel-model": ref})
                assert answer.status_code == 200 and answer.headers["x-raymodel-model"] == label
                assert answer.json() == local[int(label[-1])].predict(body)
            assert requests.get(served.url + "/info", timeout=30).json()["loaded"] == ["digits:2", "digits:3"]
            _post(s, served.url, body, **{"x-raymodel-model": "digits:1"})  # back: the LRU's oldest goes
            assert requests.get(served.url + "/info", timeout=30).json()["loaded"] == ["digits:3", "digits:1"]
            missing = _post(s, served.url, body, **{"x-raymodel-model": "digits:9"})
            assert missing.status_code == 404 and "has no version 9; versions: 1, 2, 3" in missing.json()["detail"]
            assert "digits:2 (digits@candidate)" in missing.json()["detail"]
            other = _post(s, served.url, body, **{"x-raymodel-model": "iris:1"})
            assert other.status_code == 404 and "versions of `digits` only" in other.json()["detail"]
            newest = _post(s, served.url, body)  # no header: the key's newest version
            assert newest.headers["x-raymodel-model"] == "digits:3"
    finally:
        served.shutdown()
    every = rm.Servable("*", "/every", settings=SMALL).deploy()  # any key
    try:
        with requests.Session() as s:
            answer = _post(s, every.url, body, **{"x-raymodel-model": "digits@production"})
            assert answer.status_code == 200 and answer.headers["x-raymodel-model"] == "digits:1"
            unnamed = _post(s, every.url, body)
            assert unnamed.status_code == 400 and "x-raymodel-model" in unnamed.json()["detail"]
            assert _post(s, every.url, body, **{"x-raymodel-model": "iris:1"}).status_code == 404
    finally:
        every.shutdown()


@pytest.mark.integration
def test_a_multiplexed_request_goes_to_the_replica_that_holds_its_version(versions):
    """Two replicas holding one version each: Serve's router sends each version's requests to its
    replica (the router calls by handle; HAProxy alone would spread them and each replica would
    load and evict on every other request)."""
    body = {"pixels": versions["X"][:1].tolist()}
    settings = {**SMALL, "num_replicas": 2, "max_models_per_replica": 1}
    served = rm.Servable("digits@*", "/two", settings=settings).deploy()
    try:
        with requests.Session() as s:
            ask = lambda label: _post(s, served.url, body, **{"x-raymodel-model": label})  # noqa: E731
            ask("digits:1")
            time.sleep(0.5)  # each replica tells the router what it holds every 0.1 s
            ask("digits:2")
            time.sleep(0.5)
            answered = collections.defaultdict(set)
            for i in range(40):
                label = f"digits:{1 + i % 2}"
                answer = ask(label)
                assert answer.status_code == 200 and answer.headers["x-raymodel-model"] == label
                answered[label].add(answer.headers["x-raymodel-replica"])
        assert all(len(pids) == 1 for pids in answered.values()), answered
        assert answered["digits:1"] != answered["digits:2"], answered  # one replica per version, no thrash
    finally:
        served.shutdown()


@pytest.mark.integration
def test_train_by_reference_registers_a_child_the_split_route_then_serves(split, versions):
    import ray

    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    command = [sys.executable, "-m", "raymodel.cli", "train", "digits@production", "--data", "models:digits_data"]
    command += ["--set", "num_epochs=1", "--set", "lr=0", "--set", "progress=false", "--register", "digits@candidate"]
    done = subprocess.run([*command, "--wait"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SUCCEEDED: registered digits:4" in done.stdout, done.stdout
    record = rm.registry.show("digits", 4)
    assert record.lineage["parent"] == "digits:1" and record.aliases == ["candidate"]
    assert record.lineage["config"]["lr"] == 0
    body = {"pixels": versions["X"][:5].tolist()}
    # lr=0: the weights it registered are the ones it started from, version 1's (not its seed's)
    assert rm.registry.get("digits", 4).predict(body) == versions["local"][1].predict(body)
    assert versions["local"][1].predict(body) != DigitsNet(config={"seed": 0}).predict(body)
    # the split route follows the alias that moved: the candidate's share is answered by version 4
    keys = [{"x-raymodel-key": f"user-{i}"} for i in range(200)]
    until(lambda: "digits:4" in {a.headers["x-raymodel-model"] for a in _many(split.url, [(body, k) for k in keys])})
    answers = _many(split.url, [(body, k) for k in keys])
    assert {a.headers["x-raymodel-model"] for a in answers} == {"digits:1", "digits:4"}
    # The job recorded the signature of what it trained on; a request of another width is the client's error
    child = rm.registry.get("digits", 4)
    assert child.input_signature == {"shape": [64], "dtype": "float32", "nonfinite": "warn"}
    with pytest.raises(DataError, match="^expected rows of 64 values, got 4$"):
        child.predict({"pixels": [[0.0] * 4]})
    key = next(k for k, a in zip(keys, answers) if a.headers["x-raymodel-model"] == "digits:4")
    refused = _post(requests.Session(), split.url, {"pixels": [[0.0] * 4]}, **key)
    assert refused.status_code == 422 and refused.json()["detail"] == "expected rows of 64 values, got 4"


@pytest.mark.integration
def test_train_by_reference_takes_a_data_module_class_and_sets_it_up_on_the_worker(versions):
    import ray

    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    command = [sys.executable, "-m", "raymodel.cli", "train", "digits:3", "--data", "models:DigitsData"]
    command += ["--set", "num_epochs=1", "--set", "progress=false", "--wait"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = done.stdout.split()[0]
    assert f"{job_id} SUCCEEDED" in done.stdout, done.stdout
    history = rm.jobs.get(job_id).history()
    assert len(history) == 1 and history[0]["val_loss"] > 0  # DigitsData().setup(config) gave a valid split too


@pytest.mark.integration
def test_tune_by_reference_registers_its_best_trial_with_its_parent(versions):
    job = rm.jobs.submit(
        "digits@production",
        "tune",
        settings={"num_samples": 2, "max_epochs": 1, "metric": "val_loss", "train": {"progress": False}},
        space={"lr": rm.tune.choice([0.0, 0.01])},
        data="models:digits_data",
        register="digits",
    )
    result = job.wait(timeout=300)
    made = job.registered
    record = rm.registry.show("digits", int(made.split(":")[1]))
    assert record.lineage["parent"] == "digits:1" and record.lineage["trial_id"] == result.best_trial_id
