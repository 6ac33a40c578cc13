"""What the dashboard shows, as JSON-able dicts: jobs, one job, models, routes, resources.

Every figure comes from the real source: the job server's records, Ray's
state API (what a job holds), the registry, Ray Serve's status and each
route's replica, and Ray's cluster and available resources.
"""

from __future__ import annotations

import math
import time
from typing import Any


def jobs() -> list[dict[str, Any]]:
    """Every job, newest first: status, kind, model, times, progress, what it holds now."""
    from raymodel import jobs as jobs_module

    server = jobs_module.server(start=False)
    if server is None:
        return []
    import ray

    records = ray.get(server.list.remote())
    holds = jobs_module.held(records)
    now = time.time()
    for r in records:
        r["resources"] = holds[r["id"]]
        r["duration_s"] = ((r.get("ended") or now) - r["started"]) if r.get("started") else None
        r["progress"] = _progress(r)
    return _clean(sorted(records, key=lambda r: r["submitted"], reverse=True))


def job(job_id: str) -> dict[str, Any] | None:
    """One job with its rows, log, result and (tune) trials; ``None`` when there is no such job."""
    import ray

    from raymodel import jobs as jobs_module

    server = jobs_module.server(start=False)
    record = None if server is None else ray.get(server.get.remote(job_id))
    if record is None:
        return None
    rows = ray.get(server.rows.remote(job_id, 0))[0]
    record["history"] = [row for row in rows if "end" not in row]  # epochs; a release's stage rows apart:
    record["stages"] = [{**row, "text": jobs_module.describe_stage(row)} for row in rows if "end" in row]
    if record["kind"] == "release":  # its stages' timeline
        record["stage"] = jobs_module.current_stage(rows, record["status"])
    record["resources"] = jobs_module.held([record])[job_id]
    record["metrics"] = sorted(
        {
            k
            for row in record["history"]
            for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "epoch"
        }
    )
    if record["kind"] == "tune":
        record["trials"], record["best_trial_id"] = _trials(record)
    return _clean(record)


def models() -> list[dict[str, Any]]:
    """Registry keys, each with its versions (aliases, metrics, lineage, the job that made it)."""
    from raymodel.registry import Registry, default_uri

    registry = Registry(default_uri())
    by_path = {r["result_path"]: r["id"] for r in _safe(jobs, []) if r.get("result_path")}
    out = []
    for key in registry.keys():
        versions = []
        for record in sorted(registry.list(key), key=lambda r: r.version, reverse=True):
            lineage = dict(record.lineage)
            made_by = lineage.get("run_path") or lineage.get("experiment_path")
            versions.append(
                {
                    "version": record.version,
                    "aliases": record.aliases,
                    "created": record.created,
                    "metrics": record.metrics,
                    "lineage": lineage,
                    "model_class": record.model_class,
                    "backend": record.backend,
                    "job": by_path.get(made_by),
                }
            )
        out.append({"key": key, "versions": versions})
    return _clean(out)


def routes() -> list[dict[str, Any]]:
    """Each Ray Serve application: route, health, and (a raymodel route) its replica's last minute."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return []  # Serve is not running: nothing is served
    from ray import serve

    out = []
    for name, app in serve.status().applications.items():
        deployments = {d: str(getattr(s.status, "value", s.status)) for d, s in app.deployments.items()}
        replicas = sum(
            int(n)
            for s in app.deployments.values()
            for state, n in s.replica_states.items()
            if str(getattr(state, "value", state)) == "RUNNING"
        )
        entry: dict[str, Any] = {
            "name": name,
            "route": None,
            "status": str(getattr(app.status, "value", app.status)),
            "healthy": all(v == "HEALTHY" for v in deployments.values()) and bool(deployments),
            "deployments": deployments,
            "replicas": replicas,
            "stats": None,
        }
        try:
            entry["stats"] = serve.get_app_handle(name).stats.remote().result(timeout_s=3)
            entry["route"] = entry["stats"]["route"]
        except Exception:  # noqa: BLE001 - not a raymodel route, or not up yet: health alone
            pass
        out.append(entry)
    return _clean(out)


def rollouts() -> list[dict[str, Any]]:
    """Every rollout the cluster's controller knows, newest first: step, shares, the guard and the
    candidate's figures."""
    from raymodel import serve

    return _clean([r.state() for r in reversed(serve.rollouts())])


def resources() -> dict[str, Any]:
    """The cluster's CPUs, GPUs and memory (total, used, free), what each running job holds, and the
    training server's pools (workers, what each holds, busy or idle since when, jobs run)."""
    import ray

    total, free = ray.cluster_resources(), ray.available_resources()
    cluster = {}
    for name in ("CPU", "GPU", "memory", "object_store_memory"):
        if name in total:
            have, left = float(total[name]), float(free.get(name, 0.0))
            cluster[name] = {"total": have, "used": have - left, "free": left}
    running = [
        {"id": r["id"], "kind": r["kind"], "resources": r["resources"]}
        for r in _safe(jobs, [])
        if r["status"] == "RUNNING"
    ]
    from raymodel import jobs as jobs_module

    now = time.time()
    pools = [
        {
            "id": p.id,
            "key": p.key,
            "backend": p.backend,
            "workers": p.num_workers,
            "resources": p.resources,
            "state": p.state,
            "since_s": (now - p.idle_since) if p.idle_since else (now - p.started),
            "job": p.job,
            "jobs_run": p.jobs_run,
        }
        for p in _safe(jobs_module.pools, [])
    ]
    nodes = len([n for n in ray.nodes() if n["Alive"]])
    return _clean({"cluster": cluster, "jobs": running, "pools": pools, "nodes": nodes})


def _progress(record: dict[str, Any]) -> str:
    if record["kind"] == "tune":
        return f"{record.get('num_trials', 0)} trials, {record.get('rows', 0)} epochs reported"
    return f"epoch {record.get('last_epoch', 0)} of {record.get('epochs') or '?'}"


def _trials(record: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """Each trial: config, its rows' last metric, epochs, status, stopped early; and the best one."""
    metric, mode, planned = record.get("metric"), record.get("mode") or "min", record.get("epochs")
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in record["history"]:
        rows.setdefault(row["trial_id"], []).append(row)
    trials = []
    for trial_id in sorted(set(rows) | set(record.get("trials") or {})):
        info = (record.get("trials") or {}).get(trial_id, {})
        mine = rows.get(trial_id, [])
        epochs = max((r.get("epoch", 0) for r in mine), default=0)
        status = info.get("status", "RUNNING")
        value = mine[-1].get(metric) if mine and metric else None
        trials.append(
            {
                "trial_id": trial_id,
                "config": info.get("config", {}),
                "status": status,
                "epochs": epochs,
                "metric": value,
                "stopped_early": status == "TERMINATED" and bool(planned) and epochs < int(planned or 0),
            }
        )
    result = record.get("result") or {}
    best = result.get("best_trial_id") or None
    if best is None:
        scored = [t for t in trials if isinstance(t["metric"], (int, float)) and math.isfinite(t["metric"])]
        if scored:
            best = (min if mode == "min" else max)(scored, key=lambda t: t["metric"])["trial_id"]
    return trials, best


def _safe(fn: Any, default: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a page's side panel never takes the page down
        return default


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become ``None`` (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
