"""``raymodel k8s cluster|job|service``: KubeRay's resources as YAML on standard output (``-o FILE``: there),
nothing else there; what they say besides goes to standard error."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from raymodel.cli._release import add_release_options, release_flags
from raymodel.cli._serving import served_refs


def add_commands(sub: Any) -> None:
    k8s = sub.add_parser("k8s", help="KubeRay's resources (RayCluster, RayJob, RayService) as YAML")
    kinds = k8s.add_subparsers(dest="command", required=True)

    cluster = kinds.add_parser("cluster", help="a RayCluster whose head runs the training server")
    cluster.add_argument("--name", required=True, help="the RayCluster's name (DNS-1035, at most 53 characters)")
    _cluster_options(cluster, warm="auto")
    cluster.set_defaults(handler=_cluster)

    job = kinds.add_parser("job", help="a RayJob that runs `raymodel train|tune|release REF ... --wait`")
    job.add_argument("ref", help="the registry version to train further: KEY, KEY:VERSION or KEY@ALIAS")
    job.add_argument("--data", required=True, metavar="MODULE:OBJECT", help="the data, importable on the cluster")
    job.add_argument("--name", help="the RayJob's name (default: KEY-VERB; DNS-1035, at most 47 characters)")
    verb = job.add_mutually_exclusive_group()
    verb.add_argument("--tune", dest="verb", action="store_const", const="tune", help="tune instead of train")
    verb.add_argument(
        "--release",
        dest="verb",
        action="store_const",
        const="release",
        help="a release (gate, register, roll out, promote): with --register and --gate",
    )
    job.add_argument(
        "--set",
        dest="pairs",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting or config key, as `raymodel train --set`",
    )
    job.add_argument("--register", metavar="KEY[@ALIAS]", help="register the result as the next version of KEY")
    add_release_options(job, required=False)  # with --release
    job.add_argument(
        "--cluster",
        dest="on_cluster",
        metavar="NAME",
        help="run on this RayCluster (clusterSelector), not one of its own",
    )
    job.add_argument("--working-dir", metavar="URI", help="a zip of the code the job imports (s3://..., https://...)")
    job.add_argument(
        "--py-module",
        dest="py_modules",
        action="append",
        default=[],
        metavar="URI",
        help="a zip of a package the job imports; repeat for several",
    )
    job.add_argument("--pip", action="append", default=[], metavar="REQUIREMENT", help="a pip requirement; repeat")
    job.add_argument(
        "--shutdown-after-job",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="delete the cluster the job made when it ends (default: yes; not with --cluster)",
    )
    job.add_argument("--ttl-s", type=int, help="seconds the finished job's cluster is kept first")
    job.add_argument("--backoff-limit", type=int, help="retries of a failed job, each on a new cluster")
    _cluster_options(job, warm="none", required=False)
    job.set_defaults(handler=_job, verb="train")

    service = kinds.add_parser("service", help="a RayService of a route of registry versions")
    service.add_argument("route", help="the URL path, e.g. /digits")
    service.add_argument(
        "refs",
        nargs="+",
        metavar="REF[=WEIGHT]",
        help="a version, or a split: digits@production=0.9 digits@candidate=0.1",
    )
    service.add_argument("--name", help="the RayService's name (default: from the route; at most 47 characters)")
    service.add_argument("--shadow", metavar="REF", help="a version that gets a copy of each request")
    service.add_argument("--api", choices=("raymodel", "openai"), default="raymodel")
    service.add_argument("--api-keys-secret", metavar="SECRET", help="a Secret whose key `keys` holds the route's keys")
    service.add_argument("--replicas", default="1", help="a number, or 'auto'")
    service.add_argument("--max-models", type=int, default=None, help="versions a replica of KEY@* holds at most")
    _cluster_options(service, warm="none")
    service.set_defaults(handler=_service)


def _cluster_options(cmd: Any, warm: str, required: bool = True) -> None:
    need = " (required unless --cluster)" if not required else ""
    cmd.add_argument("--image", required=required, help=f"the pods' image, with Ray and raymodel{need}")
    cmd.add_argument(
        "--storage",
        metavar="URI",
        help="the cluster's RAYMODEL_HOME, s3://bucket/raymodel (default: this RAYMODEL_HOME)",
    )
    cmd.add_argument("--workers", type=int, default=1, help="worker pods at the start (default 1)")
    cmd.add_argument("--min-workers", type=int, help="the autoscaler's least (default: --workers)")
    cmd.add_argument("--max-workers", type=int, help="the autoscaler's most (default: --workers)")
    cmd.add_argument("--worker-cpus", default="1", help="each worker's CPUs (default 1)")
    cmd.add_argument("--worker-gpus", type=int, default=0, help="each worker's GPUs (default 0)")
    cmd.add_argument("--worker-memory", default="4Gi", help="each worker's memory (default 4Gi)")
    cmd.add_argument("--head-cpus", default="2", help="the head's CPUs (default 2)")
    cmd.add_argument("--head-memory", default="8Gi", help="the head's memory (default 8Gi)")
    cmd.add_argument("--warm", default=warm, help=f"the training server's warm pools (default {warm})")
    cmd.add_argument("--storage-secret", metavar="SECRET", help="a Secret of the storage's credentials (envFrom)")
    cmd.add_argument("--redis", metavar="ADDRESS", help="GCS fault tolerance on this Redis (host:port)")
    cmd.add_argument("--redis-password-secret", metavar="SECRET", help="a Secret whose key `password` is Redis'")
    cmd.add_argument("-o", "--output", metavar="FILE", help="write the YAML there instead of standard output")


def _shape(args: argparse.Namespace) -> Any:
    from raymodel.k8s import ClusterShape, check_storage

    return ClusterShape(
        image=args.image,
        storage=check_storage(args.storage or os.environ.get("RAYMODEL_HOME")),
        workers=args.workers,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        worker_cpus=args.worker_cpus,
        worker_gpus=args.worker_gpus,
        worker_memory=args.worker_memory,
        head_cpus=args.head_cpus,
        head_memory=args.head_memory,
        warm=args.warm,
        storage_secret=args.storage_secret,
        keys_secret=getattr(args, "api_keys_secret", None),
        redis=args.redis,
        redis_password_secret=args.redis_password_secret,
    )


def _cluster(args: argparse.Namespace) -> None:
    from raymodel import k8s

    _emit(args, k8s.cluster(args.name, _shape(args)))


def _job(args: argparse.Namespace) -> None:
    from raymodel import k8s

    if not args.on_cluster and not args.image:
        from raymodel.k8s import check_job_cluster

        check_job_cluster(False, False, args.backoff_limit, bool(args.shutdown_after_job))  # names the rule
    shape = None if args.on_cluster and args.image is None else _shape(args)
    release: list[str] = []
    if args.verb == "release":
        if not args.gate:
            from raymodel.exceptions import SettingsError

            raise SettingsError("A release's job needs `--gate METRIC` (the figure its gate compares).")
        release = release_flags(args)
    key = args.ref.split("@")[0].split(":")[0]
    name = args.name or f"{key}-{args.verb}".lower().replace("_", "-")
    manifest = k8s.job(
        name,
        args.ref,
        data=args.data,
        verb=args.verb,
        register=args.register,
        sets=args.pairs,
        release=release,
        shape=shape,
        cluster_name=args.on_cluster,
        working_dir=args.working_dir,
        py_modules=args.py_modules,
        pip=args.pip,
        shutdown_after_job=args.shutdown_after_job,
        ttl_s=args.ttl_s,
        backoff_limit=args.backoff_limit,
    )
    _emit(args, manifest)


def _service(args: argparse.Namespace) -> None:
    from raymodel import k8s

    replicas: Any = (
        "auto" if args.replicas == "auto" else int(args.replicas) if args.replicas.isdigit() else args.replicas
    )
    settings: dict[str, Any] = {"num_replicas": replicas, "api": args.api}
    if args.max_models is not None:
        settings["max_models_per_replica"] = args.max_models
    name = args.name or (args.route.strip("/").replace("/", "-").replace("_", "-").lower() or "raymodel")
    manifest = k8s.service(
        name,
        args.route,
        served_refs(args.refs),
        _shape(args),
        shadow=args.shadow,
        settings=settings,
        registry=args.registry,
    )
    _emit(args, manifest)


def _emit(args: argparse.Namespace, manifest: dict[str, Any]) -> None:
    """The manifest as YAML on standard output, or written whole to ``-o FILE`` (said on standard error)."""
    from raymodel import k8s

    text = k8s.to_yaml([manifest])
    if not args.output:
        sys.stdout.write(text)
        return
    from raymodel._internal import storage

    storage.write_text(args.output, text)
    print(
        f"wrote {args.output}: {manifest['kind']} {manifest['metadata']['name']} (kubectl apply -f {args.output})",
        file=sys.stderr,
    )
