"""KubeRay's ``ray.io/v1`` resources for raymodel: a ``RayCluster`` whose head runs the training server, a
``RayJob`` whose entrypoint is a raymodel command, a ``RayService`` whose ``serveConfigV2`` is a route's
Serve config (``rm.serve.config``). Each is a plain dict, checked against KubeRay's rules (``_rules``)
before it is returned; ``to_yaml`` writes them as one YAML stream."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any, Mapping, Sequence

from raymodel.exceptions import SettingsError
from raymodel.k8s import _rules

API_VERSION = "ray.io/v1"
#: The variable the head's and workers' processes read a route's keys from (a Secret's key ``keys``).
KEYS_VARIABLE = "RAYMODEL_API_KEYS"
#: The ports of a head: Ray's GCS, the dashboard (Ray's Jobs API: clients off the cluster), Serve's HTTP.
HEAD_PORTS = (("gcs-server", 6379), ("dashboard", 8265), ("serve", 8000))


@dataclasses.dataclass(frozen=True)
class ClusterShape:
    """What a RayCluster is made of: its image, its head, one worker group, its storage and keys.

    Attributes:
        image: The container image of every pod: Ray and raymodel installed, the versions of this machine's.
        storage: ``RAYMODEL_HOME`` of the cluster, a URI every pod reaches (``s3://bucket/raymodel``).
        workers: The worker group's pods at the start; ``min_workers``/``max_workers`` bound the autoscaler
            (both default to ``workers``: no autoscaling).
        worker_cpus, worker_gpus, worker_memory: Each worker pod's resources (requests and limits).
        head_cpus, head_memory: The head pod's.
        warm: The training server's warm pools (``raymodel server start --warm``): ``"torch:2"``, ``"none"``.
        storage_secret: A Secret whose keys become every container's environment (``envFrom``: the storage's
            credentials, ``AWS_ACCESS_KEY_ID``, ...; the values stay in the Secret).
        keys_secret: A Secret whose key ``keys`` holds a route's API keys (``RAYMODEL_API_KEYS`` in the pods).
        redis: GCS fault tolerance on this Redis (``redis:6379``); ``redis_password_secret``: a Secret whose
            key ``password`` holds its password.
    """

    image: str
    storage: str
    workers: int = 1
    min_workers: int | None = None
    max_workers: int | None = None
    worker_cpus: str = "1"
    worker_gpus: int = 0
    worker_memory: str = "4Gi"
    head_cpus: str = "2"
    head_memory: str = "8Gi"
    warm: str = "auto"
    storage_secret: str | None = None
    keys_secret: str | None = None
    redis: str | None = None
    redis_password_secret: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image.strip():
            raise SettingsError("`--image` is required: the container image with Ray and raymodel installed.")
        object.__setattr__(self, "storage", _rules.check_storage(self.storage))
        low = self.workers if self.min_workers is None else self.min_workers
        high = self.workers if self.max_workers is None else self.max_workers
        _rules.check_workers(self.workers, low, high)
        object.__setattr__(self, "min_workers", low)
        object.__setattr__(self, "max_workers", high)
        for label, field in (
            ("--worker-cpus", "worker_cpus"),
            ("--worker-memory", "worker_memory"),
            ("--head-cpus", "head_cpus"),
            ("--head-memory", "head_memory"),
        ):
            object.__setattr__(self, field, _rules.check_quantity(label, getattr(self, field)))
        _rules.check_gpus(self.worker_gpus)
        from raymodel.jobs import parse_warm

        parse_warm(self.warm, cpus=float(_cpus(self.head_cpus)))  # a bad value fails here, named
        if self.redis_password_secret and not self.redis:
            raise SettingsError("`--redis-password-secret` is the password of `--redis ADDRESS`: give the address too.")


def cluster(name: str, shape: ClusterShape) -> dict[str, Any]:
    """A ``RayCluster`` named ``name``: its head runs the training server as ``raymodel server start`` does."""
    return _resource("RayCluster", name, cluster_spec(shape))


def cluster_spec(shape: ClusterShape, *, training_server: bool = True) -> dict[str, Any]:
    """A RayCluster's ``spec`` (also a RayJob's ``rayClusterSpec`` and a RayService's ``rayClusterConfig``).

    Ray's token auth is on (``authOptions``: KubeRay makes the token's Secret and gives every Ray container
    ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN``). With ``training_server``, the head's container starts it once
    Ray runs there (a ``postStart`` hook: ``raymodel server start --attach``, its warm pools in the
    background); the server is a detached actor, so it outlives the hook.
    """
    import ray

    env = _env(shape)
    secrets = [{"secretRef": {"name": shape.storage_secret}}] if shape.storage_secret else []
    head: dict[str, Any] = {
        "name": "ray-head",
        "image": shape.image,
        "env": env,
        **({"envFrom": secrets} if secrets else {}),
        "ports": [{"containerPort": port, "name": name} for name, port in HEAD_PORTS],
        "resources": _resources(shape.head_cpus, shape.head_memory, 0),
    }
    if training_server:
        head["lifecycle"] = {"postStart": {"exec": {"command": ["/bin/sh", "-c", server_command(shape)]}}}
    worker = {
        "name": "ray-worker",
        "image": shape.image,
        "env": env,
        **({"envFrom": secrets} if secrets else {}),
        "resources": _resources(shape.worker_cpus, shape.worker_memory, shape.worker_gpus),
    }
    spec: dict[str, Any] = {
        "rayVersion": ray.__version__,
        "authOptions": {"mode": "token"},
        "headGroupSpec": {
            "rayStartParams": {"dashboard-host": "0.0.0.0"},  # clients off the cluster reach the Jobs API
            "template": {"spec": {"containers": [head]}},
        },
        "workerGroupSpecs": [
            {
                "groupName": "gpu-workers" if shape.worker_gpus else "workers",
                "replicas": shape.workers,
                "minReplicas": shape.min_workers,
                "maxReplicas": shape.max_workers,
                "rayStartParams": {},
                "template": {"spec": {"containers": [worker]}},
            }
        ],
    }
    if shape.min_workers != shape.max_workers:
        spec["enableInTreeAutoscaling"] = True
    if shape.redis:
        options: dict[str, Any] = {"redisAddress": shape.redis}
        if shape.redis_password_secret:
            options["redisPassword"] = {
                "valueFrom": {"secretKeyRef": {"name": shape.redis_password_secret, "key": "password"}}
            }
        spec["gcsFaultToleranceOptions"] = options
    return spec


def server_command(shape: ClusterShape) -> str:
    """The head's ``postStart`` command: the training server on the head's Ray, once that runs."""
    return f"raymodel server start --attach --warm {shlex.quote(shape.warm)} > /tmp/raymodel-server.log 2>&1"


def job(
    name: str,
    ref: str,
    *,
    data: str,
    verb: str = "train",
    register: str | None = None,
    sets: Sequence[str] = (),
    release: Sequence[str] = (),
    shape: ClusterShape | None = None,
    cluster_name: str | None = None,
    working_dir: str | None = None,
    py_modules: Sequence[str] = (),
    pip: Sequence[str] = (),
    shutdown_after_job: bool | None = None,
    ttl_s: int | None = None,
    backoff_limit: int | None = None,
) -> dict[str, Any]:
    """A ``RayJob`` whose entrypoint is ``raymodel train|tune|release REF --data ... --wait`` (the job ends
    when the training does, and fails when it fails), on a cluster it makes (``shape``) or on the running
    cluster ``cluster_name`` (its ``clusterSelector``). ``release``: the release command's own options
    (``--gate val_acc``, ``--against digits@production``, ...), as words."""
    from raymodel._internal import name_rules

    if verb not in ("train", "tune", "release"):
        raise SettingsError(f"A RayJob's command is train, tune or release (got {verb!r}).")
    name_rules.parse_ref(ref)
    if ":" not in data or not all(data.split(":", 1)):
        raise SettingsError(f"`--data` is MODULE:OBJECT, importable on the cluster (got {data!r}).")
    if verb == "release" and not register:
        raise SettingsError("A release registers its candidate: give `--register KEY@ALIAS`.")
    if shutdown_after_job is None:
        shutdown_after_job = shape is not None
    _rules.check_job_cluster(shape is not None, cluster_name is not None, backoff_limit, shutdown_after_job)
    words = ["raymodel", verb, ref, "--data", data]
    for pair in sets:
        words += ["--set", pair]
    if register:
        words += ["--register", register]
    words += [*release, "--wait"]
    runtime_env: dict[str, Any] = {}
    if working_dir:
        runtime_env["working_dir"] = _rules.check_remote("--working-dir", working_dir)
    if py_modules:
        runtime_env["py_modules"] = [_rules.check_remote("--py-modules", module) for module in py_modules]
    if pip:
        runtime_env["pip"] = list(pip)
    spec: dict[str, Any] = {"entrypoint": shlex.join(words)}
    if runtime_env:
        import yaml

        spec["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=False)
    if shape is not None:
        spec["rayClusterSpec"] = cluster_spec(shape)
        spec["shutdownAfterJobFinishes"] = bool(shutdown_after_job)
        if ttl_s is not None:
            spec["ttlSecondsAfterFinished"] = _count("--ttl-s", ttl_s)
        if backoff_limit is not None:
            spec["backoffLimit"] = _count("--backoff-limit", backoff_limit)
    else:
        spec["clusterSelector"] = {"ray.io/cluster": _rules.check_name("RayCluster", cluster_name)}
    return _resource("RayJob", name, spec)


def service(
    name: str,
    route: str,
    what: Any,
    shape: ClusterShape,
    *,
    shadow: str | None = None,
    shadow_fraction: float = 1.0,
    settings: Mapping[str, Any] | None = None,
    registry: str | None = None,
) -> dict[str, Any]:
    """A ``RayService`` of a route of registry versions: its ``serveConfigV2`` is the route's Serve config
    (``rm.serve.config``, every reference checked against the registry first), its ``rayClusterConfig`` a
    cluster of ``shape``. The registry defaults to the cluster's (``STORAGE/registry``). A route's keys come
    from ``shape.keys_secret`` (never the manifest): the config names the variable the pods have."""
    from raymodel._internal import storage
    from raymodel.serve import config, config_yaml

    registry = _rules.check_storage(registry, "--registry") if registry else storage.join(shape.storage, "registry")
    given = dict(settings or {})
    if "api_keys" in given:
        raise SettingsError(
            "A RayService's keys come from a Secret (`--api-keys-secret NAME`, its key `keys`): a manifest "
            "never holds a key, nor their digests from this machine."
        )
    if shape.keys_secret:
        given["api_keys"] = KEYS_VARIABLE
    given.setdefault("host", "0.0.0.0")
    given.setdefault("port", dict(HEAD_PORTS)["serve"])
    document = config(
        what,
        route,
        settings=given,
        registry=registry,
        shadow=shadow,
        shadow_fraction=shadow_fraction,
    )
    spec = {"serveConfigV2": config_yaml(document), "rayClusterConfig": cluster_spec(shape, training_server=False)}
    return _resource("RayService", name, spec)


def to_yaml(manifests: Sequence[Mapping[str, Any]]) -> str:
    """``manifests`` as one YAML stream (``---`` between them), for ``kubectl apply -f``."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # a value used twice is written twice, not as `&id001`
            return True

    return yaml.dump_all([dict(m) for m in manifests], Dumper=Dumper, sort_keys=False, default_flow_style=False)


# ------------------------------------------------------------------ pieces
def _resource(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {"name": _rules.check_name(kind, name), "labels": {"app.kubernetes.io/managed-by": "raymodel"}},
        "spec": spec,
    }


def _env(shape: ClusterShape) -> list[dict[str, Any]]:
    """Every Ray container's environment: the storage, Ray's settings that ``raymodel server start`` gives
    a head (``cluster.ray_defaults``), no usage reports, and a route's keys from their Secret."""
    from raymodel._ray import cluster

    ray_env: dict[str, str] = {"RAY_USAGE_STATS_ENABLED": "0"}
    cluster.ray_defaults(ray_env)
    env: list[dict[str, Any]] = [{"name": "RAYMODEL_HOME", "value": shape.storage}]
    env += [{"name": name, "value": value} for name, value in ray_env.items()]
    if shape.keys_secret:
        env.append({"name": KEYS_VARIABLE, "valueFrom": {"secretKeyRef": {"name": shape.keys_secret, "key": "keys"}}})
    return env


def _resources(cpus: str, memory: str, gpus: int) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": cpus, "memory": memory}
    if gpus:
        amounts["nvidia.com/gpu"] = gpus
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _cpus(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _count(label: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingsError(f"`{label}` must be a whole number >= 0 (got {value!r}).")
    return value
