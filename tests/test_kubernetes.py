"""``raymodel k8s cluster|job|service``: KubeRay's resources, checked against KubeRay v1.7's CRD schemas
strictly (tests/kube_schemas.py) and its controller's rules, and run as far as they run without
Kubernetes: a RayJob's entrypoint and runtime env through Ray's Jobs API on the session's head, a
RayCluster's ``rayStartParams`` given to ``ray start`` (tests/kuberay_cluster.py, a worker in a network
namespace). A RayService's ``serveConfigV2`` is ``rm.serve.config``'s document, deployed by Ray's ``serve
deploy`` in tests/test_model_server.py and tests/test_llm_serving.py."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import zipfile
from pathlib import Path

import lane
import pytest
import yaml
from kube_schemas import problems
from models import digits_version
from s3server import S3Server
from waiting import until

import raymodel as rm
from raymodel import k8s
from raymodel.cli import main as cli_main
from raymodel.exceptions import SettingsError

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def store():
    """The cluster's storage on moto's S3 server, its registry holding `digits` 1 (production), 2 (candidate), 3."""
    with S3Server() as s3:
        reg = rm.registry.open(s3.uri("home/registry"))
        for seed, alias in ((1, "production"), (2, "candidate"), (3, None)):
            reg.put(digits_version(seed), "digits", alias=alias)
        yield s3


def _printed(capsys, argv: list[str]) -> dict:
    """What ``raymodel ARGV`` printed: one manifest, YAML alone on standard output."""
    assert cli_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    (manifest,) = list(yaml.safe_load_all(out.out))
    assert out.err == ""
    return manifest


def test_a_rayclusters_head_runs_the_training_server_with_token_auth_and_its_workers_scale(capsys, tmp_path):
    argv = ["k8s", "cluster", "--name", "digits", "--image", "me/raymodel:1", "--storage", "s3://bucket/rm",
            "--workers", "2", "--min-workers", "1", "--max-workers", "6", "--worker-cpus", "4", "--worker-gpus", "1",
            "--worker-memory", "16Gi", "--warm", "torch:2", "--storage-secret", "s3-keys", "--redis", "redis:6379",
            "--redis-password-secret", "redis-auth"]  # fmt: skip
    manifest = _printed(capsys, argv)
    assert problems(manifest) == []
    assert (manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"]) == (
        "ray.io/v1",
        "RayCluster",
        "digits",
    )
    spec = manifest["spec"]
    assert spec["authOptions"] == {"mode": "token"} and spec["enableInTreeAutoscaling"] is True
    assert spec["gcsFaultToleranceOptions"]["redisAddress"] == "redis:6379"
    (head,) = spec["headGroupSpec"]["template"]["spec"]["containers"]
    assert head["lifecycle"]["postStart"]["exec"]["command"][-1].startswith(
        "raymodel server start --attach --warm torch:2"
    )
    assert {"name": "RAYMODEL_HOME", "value": "s3://bucket/rm"} in head["env"]
    assert head["envFrom"] == [{"secretRef": {"name": "s3-keys"}}]
    assert {p["name"]: p["containerPort"] for p in head["ports"]} == {
        "gcs-server": 6379,
        "dashboard": 8265,
        "serve": 8000,
    }
    (group,) = spec["workerGroupSpecs"]
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 2, 6)
    (worker,) = group["template"]["spec"]["containers"]
    assert worker["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1}
    assert "lifecycle" not in worker and worker["envFrom"] == head["envFrom"]
    # -o FILE: the manifest there, standard output empty
    written = tmp_path / "manifests" / "cluster.yaml"
    assert cli_main([*argv, "-o", str(written)]) == 0
    out = capsys.readouterr()
    assert out.out == "" and f"wrote {written}" in out.err
    assert yaml.safe_load(written.read_text()) == manifest


def test_a_rayjob_runs_the_raymodel_command_on_a_cluster_of_its_own_or_a_named_one(capsys):
    argv = ["k8s", "job", "digits@production", "--data", "pkg.data:digits", "--register", "digits@candidate",
            "--set", "num_epochs=3", "--image", "me/raymodel:1", "--storage", "s3://bucket/rm",
            "--working-dir", "s3://bucket/code/pkg.zip", "--pip", "lightgbm==4.6.0", "--backoff-limit", "2",
            "--ttl-s", "600"]  # fmt: skip
    manifest = _printed(capsys, argv)
    assert problems(manifest) == [] and manifest["metadata"]["name"] == "digits-train"
    spec = manifest["spec"]
    assert spec["entrypoint"] == (
        "raymodel train digits@production --data pkg.data:digits --set num_epochs=3 --register digits@candidate --wait"
    )
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {
        "working_dir": "s3://bucket/code/pkg.zip",
        "pip": ["lightgbm==4.6.0"],
    }
    assert (
        spec["shutdownAfterJobFinishes"] is True
        and spec["backoffLimit"] == 2
        and spec["ttlSecondsAfterFinished"] == 600
    )
    assert "lifecycle" in spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    release = _printed(capsys, ["k8s", "job", "digits@production", "--data", "pkg.data:digits", "--release",
                                "--register", "digits@candidate", "--gate", "val_acc", "--against", "digits@production",
                                "--route", "/digits", "--steps", "0.1,1", "--min-delta", "0.01", "--max-p99-ms", "250",
                                "--cluster", "digits"])  # fmt: skip
    assert problems(release) == [] and release["metadata"]["name"] == "digits-release"
    assert (
        release["spec"]["clusterSelector"] == {"ray.io/cluster": "digits"} and "rayClusterSpec" not in release["spec"]
    )
    assert release["spec"]["entrypoint"].startswith("raymodel release digits@production --data pkg.data:digits")
    assert (
        "--gate val_acc --min-delta 0.01 --against digits@production --route /digits --steps 0.1,1 "
        "--max-p99-ms 250.0 --wait" in release["spec"]["entrypoint"]  # `raymodel release`'s options, each passed on
    )


def test_a_rayservices_serve_config_is_the_routes_and_its_keys_come_from_a_secret(capsys, store):
    storage = store.uri("home")
    argv = ["k8s", "service", "/digits", "digits@production=0.9", "digits@candidate=0.1", "--shadow", "digits:3",
            "--image", "me/raymodel:1", "--storage", storage, "--api-keys-secret", "digits-keys",
            "--replicas", "2"]  # fmt: skip
    manifest = _printed(capsys, argv)
    assert problems(manifest) == [] and manifest["metadata"]["name"] == "digits"
    config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    assert config == rm.serve.config(
        {"digits@production": 0.9, "digits@candidate": 0.1},
        "/digits",
        shadow="digits:3",
        registry=store.uri("home/registry"),
        settings={"num_replicas": 2, "api_keys": "RAYMODEL_API_KEYS"},
    )
    assert config["http_options"] == {"host": "0.0.0.0", "port": 8000}
    cluster = manifest["spec"]["rayClusterConfig"]
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert {"name": "RAYMODEL_API_KEYS", "valueFrom": {"secretKeyRef": {"name": "digits-keys", "key": "keys"}}} in head[
        "env"
    ]
    assert "lifecycle" not in head  # a service's cluster serves; no training server on it


def test_a_rayservice_of_a_missing_alias_or_of_openais_api_is_refused(store):
    storage = store.uri("home")
    with pytest.raises(rm.exceptions.RegistryError, match="no alias `nope`"):  # checked against the registry first
        k8s.service("digits", "/digits", "digits@nope", k8s.ClusterShape(image="i", storage=storage))
    with pytest.raises(SettingsError, match="OpenAI's API"):
        k8s.service(
            "digits", "/v1", "digits@*", k8s.ClusterShape(image="i", storage=storage), settings={"api": "openai"}
        )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["cluster", "--name", "Digits_1"], "must be a DNS-1035 label"),
        (["cluster", "--name", "d" * 54], "at most 53 characters"),
        (["job", "digits@production", "--data", "m:o", "--cluster", "c", "--name", "j" * 48], "at most 47 characters"),
        (["cluster", "--name", "d", "--workers", "3", "--max-workers", "2"], "minReplicas <= replicas <= maxReplicas"),
        (["cluster", "--name", "d", "--storage", "/home/me/rm"], "must be a URI that every pod"),
        (["cluster", "--name", "d", "--worker-memory", "lots"], "positive Kubernetes quantity"),
        (["cluster", "--name", "d", "--warm", "torch:two"], "Warm pool `torch:two`"),
        (["job", "digits", "--data", "m:o", "--cluster", "c", "--backoff-limit", "1"], "KubeRay refuses it"),
        (["job", "digits", "--data", "m:o", "--cluster", "c", "--shutdown-after-job"], "KubeRay refuses it"),
        (["job", "digits", "--data", "m:o", "--cluster", "c", "--working-dir", "./src"], "cannot upload this machine"),
        (["job", "digits", "--data", "m:o", "--cluster", "c", "--release", "--gate", "val_acc"], "registers"),
        (["job", "digits", "--data", "m:o", "--cluster", "c", "--release", "--register", "d@c"], "--gate"),
        (["job", "digits", "--data", "nothing", "--cluster", "c"], "MODULE:OBJECT"),
        (["job", "digits", "--data", "m:o"], "one of `rayClusterSpec`"),
        (["job", "digits", "--data", "m:o", "--cluster", "c", "--image", "i", "--storage", "s3://b"], "not both"),
    ],
)
def test_what_would_make_a_manifest_kuberay_refuses_is_refused_naming_the_rule(capsys, argv, says):
    given = list(argv)
    for flag, value in (("--image", "img"), ("--storage", "s3://b/rm")):
        if argv[0] == "cluster" and flag not in argv:
            given += [flag, value]
    assert cli_main(["k8s", *given]) == 1
    out = capsys.readouterr()
    assert out.out == "" and says in out.err, out.err


def test_the_storage_is_this_processs_raymodel_home_where_that_is_a_uri(capsys, store, monkeypatch):
    monkeypatch.setenv("RAYMODEL_HOME", store.uri("home"))
    manifest = _printed(capsys, ["k8s", "service", "/digits", "digits@production", "--image", "img"])
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"][0]["args"]["registry"] == store.uri(
        "home/registry"
    )
    monkeypatch.setenv("RAYMODEL_HOME", "/home/me/.raymodel")
    assert cli_main(["k8s", "cluster", "--name", "d", "--image", "img"]) == 1
    assert "must be a URI that every pod" in capsys.readouterr().err


def test_keys_are_never_in_a_rayservice(store):
    shape = k8s.ClusterShape(image="img", storage=store.uri("home"))
    with pytest.raises(SettingsError, match="never holds a key"):
        k8s.service("digits", "/digits", "digits@production", shape, settings={"api_keys": ["sk-1"]})


@pytest.mark.integration
def test_a_rayjobs_entrypoint_and_runtime_env_train_and_register_through_rays_job_api(ray_session, tmp_path):
    """The RayJob's entrypoint and ``runtimeEnvYAML`` as KubeRay's submitter hands them to the head:
    Ray's ``JobSubmissionClient`` on the session's head. The data module is in the job's ``working_dir``
    (a zip Ray fetches), the version trained is registered."""
    import ray
    from ray.job_submission import JobStatus, JobSubmissionClient

    home = Path(rm.registry.default_uri())  # the session's RAYMODEL_HOME/registry: the cluster's
    reg = rm.registry.open(str(home))
    start = reg.put(digits_version(4), "k8s-digits", alias="production")
    code = tmp_path / "code"
    (code / "k8s_data").mkdir(parents=True)
    (code / "k8s_data" / "__init__.py").write_text(
        "import numpy as np\nimport raymodel as rm\nfrom sklearn.datasets import load_digits\n\n"
        "def digits():\n    X, y = load_digits(return_X_y=True)\n"
        "    return rm.data.from_numpy((X / 16.0).astype(np.float32), y, valid_fraction=0.2)\n"
    )
    archive = tmp_path / "code.zip"
    with zipfile.ZipFile(archive, "w") as zf:  # one top folder, as Ray's remote working_dir takes it
        for path in code.rglob("*.py"):
            zf.write(path, Path("code") / path.relative_to(code))
    manifest = k8s.job(
        "k8s-digits-train",
        "k8s-digits@production",
        data="k8s_data:digits",
        register="k8s-digits@candidate",
        sets=["num_epochs=1", "num_workers=1", 'resources_per_worker={"CPU": 1}'],
        cluster_name="session",
        working_dir=f"file://{archive}",
    )
    assert problems(manifest) == []
    spec = manifest["spec"]
    dashboard = "http://" + ray._private.worker.global_worker.node.address_info["webui_url"]
    client = JobSubmissionClient(dashboard)
    with _found_by_auto():
        job_id = until(lambda: _submitted(client, spec), 120)  # the head's job agent may still be starting
        deadline = time.monotonic() + 420
        while client.get_job_status(job_id) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            assert time.monotonic() < deadline, client.get_job_logs(job_id)[-3000:]
            time.sleep(1.0)
    logs = client.get_job_logs(job_id)
    assert client.get_job_status(job_id) == JobStatus.SUCCEEDED, logs[-3000:]
    trained = re.search(r"(train-\S+) submitted: train k8s-digits:", logs)
    assert trained and rm.jobs.get(trained.group(1)).status == "SUCCEEDED", logs[-2000:]  # a job of this head's
    made = reg.show("k8s-digits", "candidate")
    assert made.version == start.version + 1 and "registered k8s-digits:" in logs, logs[-2000:]
    assert made.lineage["parent"] == f"k8s-digits:{start.version}", made.lineage  # trained from production


@contextlib.contextmanager
def _found_by_auto():
    """Ray's job supervisor gives a job's driver the cluster it finds by ``auto``: the address that ``ray
    start`` writes in its temp folder (``ray_current_cluster``), else any GCS running on the machine. A
    RayJob's head is a ``ray start``; this session's instance was started by ``ray.init``, which writes
    none, so a driver could join a lane's cluster running beside it, and fail when that one ends. While
    the job runs, the session's address is there, as ``ray start`` would have written it."""
    import ray
    from ray._common.utils import get_ray_address_file

    node = ray._private.worker._global_node
    path = Path(get_ray_address_file(node.get_temp_dir_path()))
    before = path.read_text() if path.exists() else None
    path.write_text(node.gcs_address)
    try:
        yield
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)


def _submitted(client, spec: dict) -> str | None:
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    # The image's PATH, where `raymodel` is (this session's Ray was started by a Python not on PATH).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        return client.submit_job(entrypoint=spec["entrypoint"], runtime_env={**runtime_env, "env_vars": {"PATH": path}})
    except RuntimeError as exc:
        if "No available agent" in str(exc):
            return None
        raise


@lane.job("kuberay_cluster", expected_s=60)
def _kuberay_cluster(scratch: Path) -> dict:
    from clusters import run_script
    from off_cluster import missing_tools

    missing = missing_tools()
    if missing:
        raise RuntimeError(f"A RayCluster's worker is formed in a network namespace, which needs {missing}.")
    return run_script("kuberay_cluster.py", [], {}, timeout=600)[0]


@pytest.mark.integration
@pytest.mark.lane("kuberay_cluster")
def test_a_rayclusters_start_params_form_a_cluster_whose_head_runs_the_training_server(lane):
    seen = lane.result("kuberay_cluster")
    assert sorted(seen["nodes"]) == sorted([seen["head"], seen["worker"]]), seen
    assert seen["cpus"] == {seen["head"]: 1.0, seen["worker"]: 1.0}, seen  # each from its container's CPU limit
    assert "training server running" in seen["server_log"] and seen["jobs"] == [], seen  # the server answered
    assert seen["task_ran_on"] == seen["worker"], seen  # the worker's CPU takes work
    assert seen["worker_home"].startswith("s3://models/home"), seen  # the worker's container env: the storage


def _kuberay_sample(name: str) -> dict:
    return next(yaml.safe_load_all((TESTS / "kuberay" / f"{name}.sample.yaml").read_text()))


@pytest.mark.parametrize("name", ["ray-cluster", "ray-job", "ray-service"])
def test_the_strict_check_takes_kuberays_own_sample(name):
    assert problems(_kuberay_sample(name)) == []


@pytest.mark.parametrize("name", ["ray-cluster", "ray-job", "ray-service"])
def test_the_strict_check_refuses_a_field_the_schema_lacks(name):
    sample = _kuberay_sample(name)
    sample["spec"]["bogus"] = 1
    assert problems(sample) == ["spec: Additional properties are not allowed ('bogus' was unexpected)"]
