"""A route of registry versions as Ray Serve's config file: Ray's own ``serve deploy serve.yaml`` (or a
RayService's ``serveConfigV2``, the same document) on any Ray cluster with raymodel installed serves it.

The file's application names raymodel's builder (``import_path: raymodel.serve:route_application``)
and hands it the route's plan as ``args``: the references (one, a split, a multiplexed key), the shadow,
the registry, the serve settings that differ from the defaults, and the route's keys as their sha256
digests or as the name of an environment variable that the cluster's processes have (a Secret's, on
Kubernetes): never a key. Its ``deployments`` say each deployment's replicas and resources where Serve
reads them, so that they can be changed in the file; a split changed in the file and deployed again
moves the traffic in place (a reconfiguration of the running replicas, not a restart).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from raymodel.exceptions import SettingsError
from raymodel.serve._settings import ServeSettings, replica_options, replica_settings

#: What a Serve config's application imports: raymodel's builder of a route from its plan.
IMPORT_PATH = "raymodel.serve:route_application"


def config(
    what: Any,
    route: str = "/",
    *,
    settings: ServeSettings | Mapping[str, Any] | None = None,
    registry: str | None = None,
    shadow: str | None = None,
    shadow_fraction: float = 1.0,
    path: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Ray Serve's config of the route that ``rm.Servable(what, route, ...)`` serves, checked as that
    checks it (each reference against the registry) before anything is written; with ``path``, also
    written there as YAML (whole or not at all).

    ``what``: a registry reference (``"digits@production"``), a split (``{"digits@production": 0.9,
    "digits@candidate": 0.1}``) or a key's versions (``"digits@*"``). ``settings["api_keys"]``: a list
    of keys (written as their digests), a file of this machine's (likewise), or the name of an
    environment variable, written as that name: the cluster's processes read it (on Kubernetes, from a
    Secret). ``settings["host"]`` and ``["port"]`` are the file's ``http_options`` (default: every
    address of the head, ``0.0.0.0``).

    Example:
        >>> rm.serve.config({"digits@production": 0.9, "digits@candidate": 0.1}, "/digits",
        ...                 shadow="digits@shadow", path="serve.yaml")   # then: serve deploy serve.yaml
    """
    from raymodel.serve._driver import Servable

    given = dict(dataclasses.asdict(settings) if isinstance(settings, ServeSettings) else settings or {})
    keys_from = _environment_variable(given.get("api_keys"))
    if keys_from is not None:
        given.pop("api_keys")  # named, not read here: the cluster's processes have it
    given.setdefault("host", "0.0.0.0")
    servable = Servable(what, route, settings=given, registry=registry, shadow=shadow, shadow_fraction=shadow_fraction)
    if servable.plan is None:
        raise SettingsError(
            "A Serve config names registry versions (`'digits@production'`, a split, `'digits@*'`): a model "
            "instance's weights are in this process. Register it first (`rm.registry.put(model, key=...)`)."
        )
    s = servable.settings
    defaults = replica_settings(ServeSettings())  # the file's `http_options` and name are its own
    chosen = {name: value for name, value in replica_settings(s).items() if value != defaults[name]}
    if "api_keys" in chosen:
        chosen["api_keys"] = list(chosen["api_keys"])  # the digests (`sha256:...`): ServeSettings keeps no key
    if keys_from is not None:
        chosen["api_keys"] = keys_from
    plan = servable.plan
    args: dict[str, Any] = {"route": servable.route, "registry": plan.registry}
    split = plan.split
    if split is not None:
        args.update({"ref": next(iter(split))} if len(split) == 1 else {"refs": list(split)})
        if plan.shadow:
            args.update(shadow=plan.shadow, shadow_fraction=plan.shadow_fraction)
    else:
        args["ref"] = plan.served
    if chosen:
        args["settings"] = chosen
    document = {
        "http_options": {"host": s.host, "port": s.port},
        "applications": [
            {
                "name": servable.name,
                "route_prefix": servable.route,
                "import_path": IMPORT_PATH,
                "args": args,
                "deployments": _deployments(servable, split),
            }
        ],
    }
    if path is not None:
        _write(Path(path), document)
    return document


def route_application(args: Mapping[str, Any]) -> Any:
    """Ray Serve's application builder of a route from the ``args`` that ``config`` writes (Serve calls
    it, where a config's ``import_path`` names it, on the cluster): the application that
    ``rm.Servable(...).deploy()`` runs for the same route, its references checked against the registry
    first."""
    from raymodel.serve._driver import Servable

    if not isinstance(args, Mapping) or "route" not in args or len({"ref", "refs", "split"} & set(args)) != 1:
        raise SettingsError(
            f"`{IMPORT_PATH}` builds a route from the `args` that `raymodel serve ... --config-out FILE` (or "
            f"`rm.serve.config`) writes: a `route` and one of `ref`, `refs` (a split's references; its weights "
            f"are the deployment's `user_config`) or `split` (got {dict(args or {})!r})."
        )
    what = args.get("split") or args.get("ref") or _even(args["refs"])
    servable = Servable(
        what,
        args["route"],
        settings=dict(args.get("settings") or {}),
        registry=args.get("registry"),
        shadow=args.get("shadow"),
        shadow_fraction=args.get("shadow_fraction", 1.0),
    )
    return servable.as_application()


def _even(refs: Any) -> dict[str, float]:
    """A split of ``refs`` to build the route with: Serve gives its replicas the file's weights (the
    deployment's ``user_config``) before they take a request."""
    if not isinstance(refs, list) or len(refs) < 2:
        raise SettingsError(f"`refs` is a list of the split's registry references, two or more (got {refs!r}).")
    return {ref: 1.0 / len(refs) for ref in refs}


def config_yaml(document: Mapping[str, Any]) -> str:
    """``document`` as YAML, in the order it was made."""
    import yaml

    return yaml.safe_dump(dict(document), sort_keys=False, default_flow_style=False)


def _deployments(servable: Any, split: Mapping[str, float] | None) -> list[dict[str, Any]]:
    """The route's deployments as a Serve config names them, with their replicas and resources; a split's
    weights are the route's deployment's ``user_config`` (Serve reconfigures running replicas with a new
    one, where a change of ``args`` rebuilds the application and restarts them)."""
    s, name = servable.settings, servable.name
    options = {k: v for k, v in replica_options(s).items() if k != "logging_config"}
    if split is not None:
        options["user_config"] = {"split": dict(split), "rollout": None}
    if servable.plan.multiplexed and s.api != "openai":  # a router in front of the versions' replicas
        return [{"name": f"{name}-router", "num_replicas": 1}, {"name": f"{name}-versions", **options}]
    return [{"name": f"{name}-model", **options}]


def _environment_variable(value: Any) -> str | None:
    """``value`` where it names an environment variable (not a file of this machine, not keys)."""
    if not isinstance(value, str) or os.path.isfile(value):
        return None
    if not value.replace("_", "").isalnum() or value[0].isdigit():
        raise SettingsError(
            f"`api_keys` is a string, so it names an environment variable (or a file) holding the keys; "
            f"`{value[:40]}` is not a variable's name. Give the variable's name (`ROUTE_KEYS`), a file, or a list."
        )
    return value


def _write(path: Path, document: Mapping[str, Any]) -> None:
    from raymodel._internal import storage

    storage.write_text(str(path), config_yaml(document))
