"""What KubeRay's controller refuses that its schemas let through, checked before a manifest is written:
each refusal names the rule (``ray-operator/controllers/ray/utils/validation.go``) and what to change."""

from __future__ import annotations

import re
from typing import Any

from raymodel.exceptions import SettingsError

#: A name as Kubernetes' DNS-1035 label: lower case letters, digits and '-', a letter first, no '-' last.
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
#: How long KubeRay lets a resource's name be: it names the pods and services it makes after it.
MAX_NAME = {"RayCluster": 53, "RayJob": 47, "RayService": 47}
#: A Kubernetes quantity (``4Gi``, ``500m``, ``2``).
QUANTITY = re.compile(r"([0-9]+(\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
#: The URI schemes Ray's runtime env fetches a package from on the cluster (not a folder of this machine).
REMOTE_SCHEMES = ("s3://", "gs://", "https://", "http://", "azure://", "abfss://", "file://")


def check_name(kind: str, name: Any) -> str:
    """``name`` as KubeRay takes it for a ``kind``: DNS-1035, at most ``MAX_NAME[kind]`` characters."""
    if not isinstance(name, str) or not DNS_1035.fullmatch(name):
        raise SettingsError(
            f"A {kind}'s name must be a DNS-1035 label (lower case letters, digits and '-', starting with a "
            f"letter, not ending with '-'), as KubeRay requires; got {name!r}."
        )
    if len(name) > MAX_NAME[kind]:
        raise SettingsError(
            f"A {kind}'s name is at most {MAX_NAME[kind]} characters (KubeRay names its pods and services after "
            f"it); {name!r} has {len(name)}."
        )
    return name


def check_workers(replicas: Any, low: Any, high: Any) -> tuple[int, int, int]:
    """A worker group's ``(replicas, minReplicas, maxReplicas)``: KubeRay's rule, ``0 <= min <= replicas
    <= max``."""
    for label, value in (("--workers", replicas), ("--min-workers", low), ("--max-workers", high)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SettingsError(f"`{label}` must be a whole number >= 0 (got {value!r}).")
    if not low <= replicas <= high:
        raise SettingsError(
            f"A worker group needs minReplicas <= replicas <= maxReplicas (KubeRay's rule); got min {low}, "
            f"replicas {replicas}, max {high}: change `--min-workers`, `--workers` or `--max-workers`."
        )
    return replicas, low, high


def check_quantity(label: str, value: Any) -> str:
    """``value`` as a Kubernetes quantity (``"8Gi"``, ``"500m"``, ``2``), as text."""
    text = str(value)
    match = None if isinstance(value, bool) else QUANTITY.fullmatch(text)
    if match is None or float(match.group(1)) <= 0:
        raise SettingsError(f"`{label}` must be a positive Kubernetes quantity, like 2, 500m or 8Gi (got {value!r}).")
    return text


def check_gpus(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingsError(f"`--worker-gpus` must be a whole number >= 0 (got {value!r}).")
    return value


def check_storage(value: Any, label: str = "--storage") -> str:
    """The cluster's storage (or registry): a URI every pod reaches (an object store), never a folder of
    this machine."""
    if value is None:
        raise SettingsError(
            f"`{label}` is required: the URI of the cluster's storage, which every pod reaches "
            "(s3://bucket/raymodel); without it, RAYMODEL_HOME is used where it is such a URI."
        )
    if not isinstance(value, str) or "://" not in value or value.startswith("file://"):
        raise SettingsError(
            f"`{label}` must be a URI that every pod of the cluster reaches, like s3://bucket/raymodel "
            f"(got {value!r}): a pod's folders are its own, and this machine's are not there."
        )
    return value.rstrip("/")


def check_remote(label: str, value: Any) -> str:
    """A package for a job's runtime env: a URI Ray fetches on the cluster (KubeRay's submitter cannot
    upload a folder of this machine)."""
    if not isinstance(value, str) or not value.startswith(REMOTE_SCHEMES):
        raise SettingsError(
            f"`{label}` of a RayJob must be a URI the cluster fetches ({', '.join(s[:-3] for s in REMOTE_SCHEMES)}), "
            f"a zip of the folder, got {value!r}: KubeRay's submitter runs on the cluster and cannot upload this "
            "machine's folders. Upload a zip (s3://bucket/code/pkg.zip) or put the package in the image."
        )
    return value


def check_job_cluster(has_spec: bool, selector: bool, backoff_limit: Any, shutdown: bool) -> None:
    """A RayJob runs on a cluster it makes (``rayClusterSpec``) or on one it names (``clusterSelector``), one
    of them; ``backoffLimit`` and ``shutdownAfterJobFinishes`` are for a cluster it makes."""
    if has_spec == selector:
        raise SettingsError(
            "A RayJob has one of `rayClusterSpec` (a cluster it makes: give `--image`) or `clusterSelector` "
            "(a cluster that runs already: `--cluster NAME`), not both and not neither (KubeRay's rule)."
        )
    if selector and backoff_limit is not None:
        raise SettingsError(
            "`--backoff-limit` retries a RayJob on a new cluster of its own; with `--cluster` (clusterSelector) "
            "KubeRay refuses it. Leave one out."
        )
    if selector and shutdown:
        raise SettingsError(
            "`--shutdown-after-job` deletes the cluster the RayJob made; with `--cluster` (clusterSelector) it "
            "made none, and KubeRay refuses it. Leave one out."
        )
