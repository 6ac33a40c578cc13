"""A client that is not a node of the cluster (``rm.init(address="http://HEAD:8265")``): Ray's Jobs API
on the dashboard's port is all it reaches (tests/off_cluster.py: the client in a network namespace of
its own, the head on ``ray start --head``, storage on S3); and a worker node on another machine
(tests/far_node.py: a node in a network namespace joins ``raymodel server start --host``'s head)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import lane
import numpy as np
import pytest

import raymodel as rm
from raymodel._internal import serialization
from raymodel._ray import remote
from raymodel.exceptions import SettingsError


@lane.job("off_cluster", expected_s=600)
def _off_cluster(scratch: Path) -> dict[str, dict]:
    from clusters import run_script
    from off_cluster import missing_tools

    missing = missing_tools()
    if missing:
        raise RuntimeError(
            f"A client off the cluster is tested from a network namespace of its own, which needs {missing}: "
            "run `make test` as root on a machine with iproute2 (CI does)."
        )
    scenarios = ["errors", "train", "job", "tune", "release", "routes", "serve", "cli", "needs"]
    return {row["scenario"]: row for row in run_script("off_cluster.py", scenarios, {}, timeout=1700)}


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_a_client_off_the_cluster_is_refused_before_anything_is_submitted_saying_what_to_do(lane):
    errors = lane.result("off_cluster")["errors"]
    wrong = errors["wrong_token"]
    assert wrong["type"] == "ClusterError" and "token is not the cluster's" in wrong["message"], wrong
    assert "RAY_AUTH_TOKEN" in wrong["message"] and "ray get-auth-token" in wrong["message"]
    none = errors["no_token"]
    assert none["type"] == "ClusterError" and "this process sent no token" in none["message"], none
    nobody = errors["nobody"]
    assert nobody["type"] == "ClusterError" and nobody["message"].startswith("No Ray cluster answers at http://")
    assert "dashboard" in nobody["message"]
    home = errors["local_home"]
    assert home["type"] == "SettingsError" and "/tmp/laptop-home" in home["message"] and "s3://" in home["message"]
    bare = errors["no_raymodel"]  # the cluster's jobs run a Python without raymodel
    assert bare["type"] == "ClusterError", bare
    assert "raymodel cannot be imported where the cluster's jobs run" in bare["message"]
    assert "No module named 'raymodel'" in bare["message"] and "Install raymodel " in bare["message"], bare
    other = errors["other_version"]  # this process's raymodel is 9.9.9, the cluster's is not
    assert other["type"] == "ClusterError" and " there, 9.9.9 here" in other["message"], other
    assert not errors["connected"]


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_a_client_off_the_cluster_trains_a_class_only_it_can_import_and_gets_its_rows_as_they_come(lane):
    seen = lane.result("off_cluster")["train"]
    assert seen["epochs"] == [1, 2, 3] and seen["val_acc"] > 0.6, seen
    assert seen["checkpoint"].startswith("s3://models/home/runs/LaptopDigits-"), seen["checkpoint"]
    # The weights came back: this process predicts what the run's last epoch scored.
    assert seen["accuracy"] == pytest.approx(seen["val_acc"], abs=1e-6)
    # Each epoch's line came while the run went on (each epoch is paced to 1.5 s), not all at its end.
    rows = seen["rows"]
    assert [line.split("epoch ")[1][:3] for _, line in rows] == ["1/3", "2/3", "3/3"], rows
    assert rows[0][0] < seen["ended_at"] - 2.0, (rows, seen["ended_at"])
    assert seen["ray_here"] is False  # no Ray in the client: no raylet, no local instance


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_a_job_of_a_client_off_the_cluster_is_listed_followed_and_waited_for(lane):
    seen = lane.result("off_cluster")["job"]
    assert seen["status_at_once"] in ("PENDING", "RUNNING") and seen["listed"] and seen["got"] == seen["id"]
    assert seen["status"] == "SUCCEEDED" and seen["history"] == [1, 2, 3, 4, 5, 6] == seen["result_epochs"]
    assert "succeeded" in seen["logs"] and "epoch 6:" in seen["logs"]
    times, epochs = zip(*seen["streamed"])
    assert list(epochs) == [1, 2, 3, 4, 5, 6], seen["streamed"]
    # Each row as its epoch ended, not all at the job's end: epoch 2 began once row 1 was here, and epochs 2
    # to 6 take 3 s each.
    assert times[-1] - times[1] > 10, seen["streamed"]
    assert seen["waited_epochs"] == [1], seen
    control = seen["control"]  # update, eta, resources and stop of a running job, from here
    assert control["change"]["config"] == {"lr": 1e-3} and control["change"]["settings"] == {"num_epochs": 50}
    assert control["eta"] is None or control["eta"] > 0, control
    assert control["holds"].get("CPU") == 2.0, control  # its 2 workers' bundles, from the cluster's state API
    assert control["status"] == "STOPPED" and 1 <= control["epochs"] < 50, control


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_calls_of_a_client_off_the_cluster_one_after_another_share_one_driver_there(lane):
    calls = lane.result("off_cluster")["job"]["calls"]
    ten = calls["ten"]
    assert ten["got"] == [lane.result("off_cluster")["job"]["id"]] * 10, ten
    assert ten["new_ray_jobs"] == 0, ten  # the driver of the calls before them took all ten
    # A driver that ended at its idle end before it took the call: another one (started now) answers it.
    replaced = calls["replaced"]
    assert replaced["got"] == lane.result("off_cluster")["job"]["id"] and replaced["new_ray_jobs"] == 1, replaced


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_a_client_off_the_cluster_tunes_with_asha_and_keeps_the_best_in_the_clusters_registry(lane):
    seen = lane.result("off_cluster")["tune"]
    assert seen["trials"] == 4 and max(seen["epochs_per_trial"]) == 3 and seen["stopped_early"] >= 1, seen
    assert seen["model_lr"] == seen["best_lr"]  # this instance took the best trial's config (and weights)
    assert seen["best_checkpoint"].startswith("s3://models/home/runs/LaptopDigits-tune-"), seen
    assert seen["registry"].startswith("s3://models/home/registry") and seen["version"] == 1
    assert seen["same"]  # the version got back from the registry predicts what the tuned instance does


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_a_client_off_the_cluster_releases_through_the_gate_and_a_rollout_to_production(lane):
    seen = lane.result("off_cluster")["release"]
    assert seen["status"] == "SUCCEEDED" and seen["version"] == "laptop-digits:2", seen
    assert seen["stages"] == ["train", "evaluate", "register", "rollout", "promote"], seen
    assert seen["production"] == 2  # the alias moved, in the registry the client reads
    assert seen["answers"] >= 10 and seen["failed"] == 0, seen  # the route answered all through its rollout


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_a_client_off_the_cluster_sets_a_routes_split_and_rolls_it_out_by_hand(lane):
    seen = lane.result("off_cluster")["routes"]
    assert seen["split"] == {"laptop-digits:1": 0.5, "laptop-digits:2": 0.5}, seen  # as the cluster's route says
    bad = seen["refused_split"]
    assert bad["type"] == "SettingsError" and "must sum to 1" in bad["message"] and bad["s"] < 1.0, bad  # here
    assert seen["status"] == "promoted" and "now names laptop-digits:1" in seen["reason"], seen
    assert seen["rollout"] in seen["listed"] and seen["production"] == 1, seen  # the alias moved
    assert seen["answers"] >= 10 and seen["failed"] == 0, seen  # no request failed through the changes


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_the_raymodel_command_with_address_runs_from_off_the_cluster(lane):
    seen = lane.result("off_cluster")["cli"]
    for name in ("status", "trained", "listed", "shown", "logs", "models", "dashboard"):
        assert seen[name]["rc"] == 0, (name, seen[name])
    assert seen["status"]["out"].startswith("raymodel server at the cluster's head; jobs: "), seen["status"]
    job = seen["job_id"]
    assert job.startswith("train-") and f"{job} SUCCEEDED: registered laptop-digits:" in seen["trained"]["out"]
    assert job in seen["listed"]["out"] and "LaptopDigits" in seen["listed"]["out"]
    assert f'"id": "{job}"' in seen["shown"]["out"] and '"registered": "laptop-digits:' in seen["shown"]["out"]
    assert "epoch 1: loss" in seen["logs"]["out"] and "succeeded" in seen["logs"]["out"], seen["logs"]
    assert "laptop-digits" in seen["models"]["out"] and " cli " in seen["models"]["out"]  # read from the store here
    head = seen["dashboard_url"].split("//", 1)[1].split(":", 1)[0]
    assert head.startswith("10.214.") and seen["page"] == 200, seen["dashboard"]  # on the head, fetched from here
    start = seen["start"]
    assert start["rc"] == 1 and "runs on the cluster's head machine" in start["err"], start
    # A `jobs` command is one call of the cluster's (and the connection's check), not one per question.
    assert seen["shown"]["s"] < seen["status"]["s"] + 10, seen


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_a_client_off_the_cluster_serves_a_registry_version_and_an_instance_it_then_reaches_over_http(lane):
    seen = lane.result("off_cluster")["serve"]
    head = seen["url"].split("//", 1)[1].split(":", 1)[0]
    assert seen["url"].endswith("/laptop") and head.startswith("10.214."), seen  # the head's address
    assert seen["status"] == 200 and seen["same"], seen  # as the registry's version answers here
    assert seen["model_url"].endswith("/laptop-model") and seen["model_same"], seen
    assert seen["after_shutdown"] == 404  # shut down from the client: the route is gone


@pytest.mark.integration
@pytest.mark.lane("off_cluster")
def test_the_modules_and_pip_requirements_a_client_names_reach_its_jobs_workers_on_a_running_server(lane):
    """``rm.init(runtime_env={"py_modules": [...], "pip": {...}})`` on a cluster whose training server the
    earlier scenarios started without them: a class whose module imports both trains on a pool of its
    env, tunes (each trial's worker group a job of the same env) and serves by reference."""
    seen = lane.result("off_cluster")["needs"]
    assert seen["status"] and seen["marks"] == [3.0, 7.0], seen  # each package, as the pool's workers imported it
    assert "+env:" in seen["pool_key"], seen["pool_key"]  # a pool of the job's env, not a warm or bare one
    env = seen["runtime_env"]
    assert env["py_modules"][0].startswith("gcs://_ray_pkg_") and env["pip"]["packages"] == ["rm_offset==1.0"]
    assert seen["trials"] == 2 and seen["trial_statuses"] == ["TERMINATED"] * 2, seen
    assert seen["best_marks"] == [3.0, 7.0], seen
    assert seen["served"] == 200 and seen["same"], seen


@lane.job("far_node", expected_s=90)
def _far_node(scratch: Path) -> dict:
    from clusters import run_script
    from off_cluster import missing_tools

    missing = missing_tools()
    if missing:
        raise RuntimeError(f"A node on another machine is tested from a network namespace, which needs {missing}.")
    return run_script("far_node.py", [], {}, timeout=600)[0]


@pytest.mark.integration
@pytest.mark.lane("far_node")
def test_a_node_on_another_machine_joins_the_server_and_a_pool_trains_across_both_and_through_its_loss(lane):
    seen = lane.result("far_node")
    assert f"other machines: worker nodes `ray start --address {seen['head']}:" in seen["said"], seen["said"]
    assert f"rm.init(address='http://{seen['head']}:" in seen["said"]
    assert seen["spread"] == sorted([seen["head"], seen["far"]]), seen  # a worker on each machine (gloo between)
    assert seen["lost_at"] == 3 and seen["reason"].startswith("waiting for "), seen
    assert seen["status"] == "SUCCEEDED", (seen["error"], seen["log"])
    assert seen["epochs"] == [1, 2, 3, 4, 5, 6, 7], seen  # resumed from its checkpoint: each epoch once


# ---------------------------------------------------------------- in-process
@pytest.fixture(autouse=True)
def _no_cluster_left():
    """No test leaves this process a client of a cluster (the session's other tests use its Ray)."""
    yield
    remote.disconnect()


def test_a_dashboard_address_is_told_from_a_gcs_address():
    assert remote.is_dashboard_address("http://head:8265") and remote.is_dashboard_address("https://ray.example/")
    assert not remote.is_dashboard_address("head:6379") and not remote.is_dashboard_address("ray://head:10001")
    assert not remote.is_dashboard_address(None) and not remote.is_dashboard_address("auto")


def test_settings_of_a_local_instance_are_refused_off_the_cluster_before_connecting():
    with pytest.raises(SettingsError, match=r"\['num_cpus'\] start or shape a Ray instance here"):
        rm.init(address="http://head.invalid:8265", num_cpus=2)
    with pytest.raises(SettingsError, match="`py_modules` here, not `working_dir`"):
        rm.init(address="http://head.invalid:8265", runtime_env={"working_dir": "."})
    assert remote.active() is None


def test_a_client_off_the_cluster_never_starts_ray_here_for_a_call_it_does_not_make_yet(monkeypatch):
    from raymodel._ray import cluster

    client = remote.Cluster("http://head.invalid:8265", {}, {"raymodel": "0", "ray": "0", "python": "3.11"})
    monkeypatch.setattr(remote, "_CLUSTER", [client])
    with pytest.raises(rm.RayModelError, match=r"client of the cluster at http://head.invalid:8265, off it"):
        cluster.ensure_ray()


def test_other_versions_on_the_cluster_are_named_with_both_sides():
    ours = {"raymodel": "0.6.0", "ray": "2.60.0", "python": "3.11"}
    assert remote.version_problem(dict(ours), ours) is None
    problem = remote.version_problem({**ours, "ray": "2.59.1", "python": "3.12"}, ours)
    assert problem == "ray 2.59.1 there, 2.60.0 here; python 3.12 there, 3.11 here"


def test_a_job_carries_the_runtime_env_its_process_named_to_a_pool_and_runner_of_its_own(monkeypatch):
    """What ``rm.init(runtime_env=...)`` named (a call's driver reads it in JOB_ENV, as a runner of such
    a job does) goes with each job the process submits: its pool's key names it, so neither a warm pool
    nor another env's is its; the pool and the runner are started with it, naming it on for the jobs
    their own processes submit (a Tune trial's worker group: the same key)."""
    from raymodel.jobs import _job

    env = {"py_modules": ["gcs://_ray_pkg_0123456789abcdef.zip"], "pip": ["rm_offset==1.0"]}
    monkeypatch.setenv(remote.JOB_ENV, json.dumps(env))
    sent: list[dict] = []

    def submitted(handle, method, kind, blob, info):
        sent.append(info)
        return {"id": "train-1", "kind": kind, "status": "PENDING"}

    monkeypatch.setattr(_job, "server_handle", lambda: "server")
    monkeypatch.setattr(_job, "call", submitted)
    pool = {"key": "torch/2x[CPU=1]", "num_workers": 2}
    _job.submit_request("train", b"", {"needs": {}, "pool": dict(pool)})
    info = sent[-1]
    assert info["runtime_env"] == env
    key = info["pool"]["key"]
    assert key.startswith("torch/2x[CPU=1]+env:") and info["pool"]["runtime_env"] == env
    actor_env = remote.with_job_env(env)
    assert actor_env["pip"] == env["pip"] and actor_env["py_modules"] == env["py_modules"]
    monkeypatch.setenv(remote.JOB_ENV, actor_env["env_vars"][remote.JOB_ENV])  # a process of that pool or runner
    _job.submit_request("train", b"", {"needs": {}, "pool": dict(pool)})
    assert sent[-1]["pool"]["key"] == key
    monkeypatch.setenv(remote.JOB_ENV, json.dumps({**env, "pip": ["rm_offset==2.0"]}))  # another env: another pool
    _job.submit_request("train", b"", {"needs": {}, "pool": dict(pool)})
    assert sent[-1]["pool"]["key"] not in (key, pool["key"])
    monkeypatch.delenv(remote.JOB_ENV)  # none named: the pools of every such job, and no env for the actors
    _job.submit_request("train", b"", {"needs": {}, "pool": dict(pool)})
    assert sent[-1]["pool"] == pool and sent[-1]["runtime_env"] == {} and remote.with_job_env({}) is None


def test_a_class_of_a_package_travels_with_the_modules_of_its_package_beside_it(tmp_path, monkeypatch):
    """The user's ``pkg.model`` takes a function from ``pkg.layers``: both go by value, so a process
    that has neither (a pool's worker on the cluster) loads the class."""
    package = tmp_path / "travelpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "layers.py").write_text("def width():\n    return 7\n")
    (package / "model.py").write_text(
        "from travelpkg.layers import width\n\nclass Model:\n    def size(self):\n        return width()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from travelpkg.model import Model

    blob = serialization.dumps(Model, Model)
    for name in ("travelpkg", "travelpkg.layers", "travelpkg.model"):
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    with pytest.raises(ImportError):
        __import__("travelpkg.layers")
    loaded = serialization.loads(blob)
    assert loaded().size() == 7 and isinstance(loaded.size, types.FunctionType)


def test_a_folder_of_this_machine_as_storage_is_refused_off_the_cluster_before_anything_is_written(
    monkeypatch, tmp_path
):
    from models import TinyNet

    client = remote.Cluster("http://head.invalid:8265", {}, {"raymodel": "0", "ray": "0", "python": "3.11"})
    monkeypatch.setattr(remote, "_CLUSTER", [client])
    rng = np.random.default_rng(0)
    X = rng.normal(size=(32, 4)).astype(np.float32)
    data = rm.data.from_numpy(X, (X[:, 0] > 0).astype(np.int64))
    runs = tmp_path / "runs"
    said = r"Off the cluster, {} must be storage that the cluster reaches too \(s3://bucket/path, gs://...\): {} is a"
    with pytest.raises(SettingsError, match=said.format(r"TrainSettings.storage_path", runs)):
        TinyNet().train({"storage_path": str(runs), "progress": False}, data=data, wait=False)
    with pytest.raises(SettingsError, match=said.format(r"TrainSettings.storage_path", runs)):
        TinyNet().train({"storage_path": str(runs), "progress": False}, data=data)
    with pytest.raises(SettingsError, match=said.format(r"TuneSettings.storage_path", runs)):
        TinyNet().tune(settings={"storage_path": str(runs), "num_samples": 2}, data=data, wait=False)
    gate = rm.Gate(metric="val_loss", against="tiny@production")
    with pytest.raises(SettingsError, match=said.format("`registry`", tmp_path)):
        TinyNet().release(data=data, register="tiny@candidate", gate=gate, registry=str(tmp_path))
    assert not any(tmp_path.iterdir())  # nothing written there (nor sent anywhere)


def test_a_folder_as_the_registry_is_refused_by_the_connection_off_the_cluster(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYMODEL_HOME", "s3://bucket/home")
    monkeypatch.setenv("RAYMODEL_REGISTRY", str(tmp_path))
    with pytest.raises(SettingsError, match=f"RAYMODEL_REGISTRY must be storage .*: {tmp_path} is a folder"):
        rm.init(address="http://head.invalid:8265")
    assert remote.active() is None


def test_a_package_too_large_for_rays_package_store_is_refused_before_upload_naming_size_and_limit(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(remote, "package_limit", lambda: 4096)
    monkeypatch.setenv("RAYMODEL_HOME", "s3://bucket/home")
    big = tmp_path / "bigpkg"
    big.mkdir()
    (big / "__init__.py").write_text("")
    (big / "weights.bin").write_bytes(np.random.default_rng(0).bytes(20_000))  # does not compress
    with pytest.raises(SettingsError, match=rf"{big} makes a package of 19\.8 KiB, .* at most 4\.0 KiB"):
        rm.init(address="http://head.invalid:8265", runtime_env={"py_modules": [str(big)]})
    # The same folder with its large file excluded, as Ray's package leaves it out: past the size check
    # (to the connection, at an address where nothing listens).
    with pytest.raises(remote.ClusterError, match="No Ray cluster answers at http://127.0.0.1:1"):
        rm.init(address="http://127.0.0.1:1", runtime_env={"py_modules": [str(big)], "excludes": ["weights.bin"]})
    client = remote.Cluster("http://head.invalid:8265", {}, {})
    monkeypatch.setattr(remote, "_CLUSTER", [client])
    with pytest.raises(SettingsError, match=r"What this call takes to the cluster \(len: .*pickles to 19\.6 KiB"):
        remote.call(len, b"x" * 20_000)


def test_the_address_given_is_the_one_reached_whatever_ray_address_says(monkeypatch):
    """Ray's Jobs API client takes RAY_ADDRESS over the address it is given: rm.init's is the one used."""
    monkeypatch.setenv("RAYMODEL_HOME", "s3://bucket/home")
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:2")
    with pytest.raises(remote.ClusterError, match=r"\(Failed to connect to Ray at address: http://127.0.0.1:1\.\)"):
        rm.init(address="http://127.0.0.1:1")
    assert os.environ["RAY_ADDRESS"] == "http://127.0.0.1:2"  # as it was
