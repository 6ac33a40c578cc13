"""raymodel on Kubernetes: KubeRay's resources (``ray.io/v1``) of a cluster whose head runs the training
server (``cluster``), a job that runs a raymodel command (``job``) and a route served from the registry
(``service``). Each is a plain dict that passes KubeRay's schemas and its controller's rules (a setting
that would break one is refused, naming the rule); ``to_yaml`` writes them for ``kubectl apply -f``.
``raymodel k8s cluster|job|service`` print them (docs/kubernetes.md)."""

from raymodel.k8s._manifests import ClusterShape, cluster, cluster_spec, job, server_command, service, to_yaml
from raymodel.k8s._rules import check_job_cluster, check_storage

__all__ = [
    "ClusterShape",
    "check_job_cluster",
    "check_storage",
    "cluster",
    "cluster_spec",
    "job",
    "server_command",
    "service",
    "to_yaml",
]
