"""The driver's side of a route of several registry versions: checking what ``Servable`` was given
(a split, a shadow, a multiplexed key) before anything starts, and the Serve application of it."""

from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping

from raymodel.exceptions import SettingsError
from raymodel.registry import Registry, default_uri, sources
from raymodel.serve._settings import replica_options, replica_settings
from raymodel.serve._traffic import check_ref, check_split


def _is_multiplexed(ref: Any) -> bool:
    """``"digits@*"`` (any version or alias of a key) or ``"*"`` (any key)."""
    return isinstance(ref, str) and (ref == "*" or ref.endswith("@*"))


def _plan(
    what: Any, shadow: str | None, shadow_fraction: float, registry: str | None, settings: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(plan, info)`` of a split, shadow or multiplexed route; every reference is checked against
    the registry now (a bad one names what exists), before any replica starts."""
    uri = registry or default_uri()
    if (
        isinstance(shadow_fraction, bool)
        or not isinstance(shadow_fraction, (int, float))
        or not math.isfinite(shadow_fraction)
        or not 0 < shadow_fraction <= 1
    ):
        raise SettingsError(f"`shadow_fraction` must be a number in (0, 1] (got {shadow_fraction!r}).")
    if shadow is not None and not isinstance(shadow, str):
        raise SettingsError(f"`shadow` takes a registry reference like 'digits@candidate' (got {shadow!r}).")
    if _is_multiplexed(what):
        if shadow is not None:
            raise SettingsError("A multiplexed route (`'digits@*'`) has no shadow: each request names its version.")
        key = what[: -len("@*")] if what != "*" else "*"
        if key != "*":
            check_ref(key, "A multiplexed route's key")
            Registry(uri).resolve(key)  # raises, naming the keys that exist
        plan = {"multiplex": key, "registry": uri, "poll_s": settings.registry_poll_s}
        _check_generates(settings, Registry(uri).show(key).backend if key != "*" else None, what)
        return plan, {"multiplex": what, "registry": uri}
    if isinstance(what, Mapping):
        split = check_split(what)
    elif isinstance(what, str) or type(what).__name__ == "ModelRef":
        check_ref(str(what), "The served reference")
        split = {str(what): 1.0}
    else:
        raise SettingsError(
            f"`shadow` takes a registry reference to shadow, served beside a registry reference "
            f"(`rm.Servable('digits@production', route, shadow='digits@candidate')`); got {type(what).__name__}."
        )
    refs = [*split, *([shadow] if shadow else [])]
    if shadow is not None:
        check_ref(shadow, "The shadow")
        if shadow in split:
            raise SettingsError(f"The shadow {shadow!r} is also in the split; shadow a version that is not answered.")
    if len(refs) > settings.max_models_per_replica:
        raise SettingsError(
            f"The route names {len(refs)} versions, more than `max_models_per_replica` "
            f"({settings.max_models_per_replica}): every replica would load versions over and over. "
            f"Raise it: `ServeSettings(max_models_per_replica={len(refs)})`."
        )
    described = {ref: sources.registry_source(ref, uri)[1] for ref in refs}  # raises, naming what exists
    first = described[refs[0]]
    for ref in refs:
        _check_generates(settings, described[ref]["backend"], ref)
    plan = {
        "split": split,
        "shadow": shadow,
        "shadow_fraction": float(shadow_fraction),
        "registry": uri,
        "poll_s": settings.registry_poll_s,
    }
    info = {
        "class": first["class"],
        "backend": first["backend"],
        "split": dict(split),
        "shadow": shadow,
        "registry": uri,
    }
    return plan, info


def _check_generates(settings: Any, backend: str | None, ref: str) -> None:
    """OpenAI's API serves a causal LM: a version of another backend is refused before anything starts
    (whether a transformers version is a causal LM is checked as its replica loads it)."""
    if settings.api == "openai" and backend is not None and backend != "transformers":
        raise SettingsError(
            f"`{ref}` is a {backend} model; OpenAI's API (`ServeSettings(api='openai')`) serves a causal "
            "language model (a `RayTransformersModel`). Serve it with the default `api='raymodel'`."
        )


def _routed_application(servable: Any) -> Any:
    """The Serve application of a route of registry versions: ``RouteServer`` (one deployment; the split
    and the rollout in its ``user_config``, so that a new split is a reconfiguration, not a restart),
    or, for a multiplexed route, ``ModelRouter`` in front of ``VersionServer``."""
    from ray import serve

    s, plan = servable.settings, dict(servable.plan)
    split = plan.pop("split", None)
    # Serve restarts a deployment whose version changes; the same version with a new ``user_config``
    # is reconfigured in place. The version is what the route is, less its weights. (Serve's Python
    # API gives every ``serve.run`` a random version, a restart; the option is private since 2.x.)
    version = hashlib.sha256(repr((sorted(plan.items()), replica_settings(s))).encode()).hexdigest()[:16]
    info = {key: value for key, value in servable.info.items() if key != "split"}
    if split is not None:
        from raymodel.serve._route_server import RouteServer

        return (
            serve.deployment()(RouteServer)
            .options(
                name=f"{servable.name}-model",
                version=version,
                _internal=True,
                user_config={"split": split, "rollout": servable.rollout_id},
                **replica_options(s),
            )
            .bind(plan, info, s.max_batch_size, s.batch_wait_timeout_s, s.max_body_bytes, s)
        )
    if s.api == "openai":  # a key's versions (LoRA adapters on one base) chosen by the request's `model`
        from raymodel.serve._adapter_server import AdapterServer

        options = {"name": f"{servable.name}-model", "version": version, "_internal": True, **replica_options(s)}
        return serve.deployment()(AdapterServer).options(**options).bind(plan, info, s)
    from raymodel.serve._route_deployments import ModelRouter, VersionServer

    options = {"name": f"{servable.name}-versions", "version": version, "_internal": True, **replica_options(s)}
    backend = (
        serve.deployment()(VersionServer)
        .options(**options)
        .bind(plan["registry"], s.max_models_per_replica, s.max_batch_size, s.batch_wait_timeout_s, s.max_body_bytes)
    )
    router = serve.deployment()(ModelRouter).options(
        name=f"{servable.name}-router",
        version=version,
        _internal=True,
        num_replicas=1,
        # Routing is a few dict look-ups and a handle call per request: it takes no CPU of its own.
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=max(256, s.max_ongoing_requests),
        logging_config={"enable_access_log": s.access_log},
    )
    return router.bind(backend, plan, info, s.max_body_bytes, s.api_keys)
