"""A route of registry versions: its plan (``RoutePlan``), and what ``Servable`` was given (a split, a
shadow, a multiplexed key) checked and planned before anything starts (``plan_route``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from raymodel.exceptions import SettingsError
from raymodel.registry import Registry, default_uri, sources
from raymodel.serve._routes.traffic import check_ref, check_split


@dataclasses.dataclass(frozen=True)
class RoutePlan:
    """What a route of registry versions serves: a ``split`` (references and their shares, summing to 1),
    with a ``shadow`` that sees ``shadow_fraction`` of the requests and answers none; or, ``multiplex``,
    any version of a key (``"*"``: of any key) that each request names. ``registry``: where the versions
    are; ``poll_s``: how often a replica looks whether an alias moved."""

    registry: str
    poll_s: float = 2.0
    split: dict[str, float] | None = None
    shadow: str | None = None
    shadow_fraction: float = 1.0
    multiplex: str | None = None

    def with_split(self, split: Mapping[str, float]) -> RoutePlan:
        return dataclasses.replace(self, split=dict(split))

    @property
    def multiplexed(self) -> bool:
        return self.multiplex is not None

    @property
    def key(self) -> str:
        """A multiplexed route's key (``"*"``: any)."""
        if self.multiplex is None:
            raise ValueError("a route of a split has no key of its own: it is not multiplexed")
        return self.multiplex

    @property
    def served(self) -> str | dict[str, float]:
        """The ``Servable``'s first argument for this plan: the split, or ``"KEY@*"`` (``"*"``)."""
        if self.split is not None:
            return dict(self.split)
        return f"{self.multiplex}@*" if self.multiplex != "*" else "*"


@dataclasses.dataclass(frozen=True)
class RouteSpec:
    """A running route of registry versions, as a rollout controller needs it to redeploy the route: its
    plan (with the split it serves now), its ``ServeSettings``, and the rollout it is in (``None``: none)."""

    plan: RoutePlan
    settings: Any
    rollout: str | None


def is_multiplexed(ref: Any) -> bool:
    """``"digits@*"`` (any version or alias of a key) or ``"*"`` (any key)."""
    return isinstance(ref, str) and (ref == "*" or ref.endswith("@*"))


def plan_route(
    what: Any, shadow: str | None, shadow_fraction: float, registry: str | None, settings: Any
) -> tuple[RoutePlan, dict[str, Any]]:
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
    if is_multiplexed(what):
        if shadow is not None:
            raise SettingsError("A multiplexed route (`'digits@*'`) has no shadow: each request names its version.")
        key = what[: -len("@*")] if what != "*" else "*"
        if key != "*":
            check_ref(key, "A multiplexed route's key")
            Registry(uri).resolve(key)  # raises, naming the keys that exist
        plan = RoutePlan(uri, settings.registry_poll_s, multiplex=key)
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
    plan = RoutePlan(
        uri, settings.registry_poll_s, split=dict(split), shadow=shadow, shadow_fraction=float(shadow_fraction)
    )
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
