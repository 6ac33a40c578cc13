"""Routes of registry versions as declarations kept in raymodel's storage, served again when a head
starts on the same storage (as KubeRay's RayService re-applies its Serve config).

``Servable.deploy()`` of a route of registry versions writes what it serves (its split or
multiplexed key, shadow, registry and settings) to ``$RAYMODEL_HOME/serve/routes.declared/<app>.json``;
a new split set outside a rollout replaces it (a rollout's steps do not: after a restart the
rollout sets them again, ``serve/_rollouts/controller.py``); ``shutdown()`` removes it. The training server,
loading a previous head's records (``jobs/_server/recovery.py``), serves each declared route that
is not running (``restore.py``). A route of a model instance (its weights saved for it) is not declared: it is the
process's own, and goes with it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from raymodel._internal import locations, storage


def _folder() -> str:
    return locations.home_path("serve", "routes.declared")  # no application's name has a dot


def declare(servable: Any) -> None:
    """Keep what ``servable`` (a deployed route of registry versions) serves."""
    plan = servable.plan
    what = plan.served
    declaration = {
        "name": servable.name,
        "route": servable.route,
        "what": what,
        "shadow": plan.shadow,
        "shadow_fraction": plan.shadow_fraction,
        "registry": plan.registry,
        "settings": dataclasses.asdict(servable.settings),
    }
    storage.write_bytes(storage.join(_folder(), f"{servable.name}.json"), json.dumps(declaration).encode())


def forget(name: str) -> None:
    """The route ``name`` is shut down: not served again."""
    storage.delete(storage.join(_folder(), f"{name}.json"))


def declared() -> list[dict[str, Any]]:
    """Every declared route (one whose file cannot be read is left out)."""
    found = []
    for name in storage.listdir(_folder()):
        if name.endswith(".json"):
            try:
                found.append(json.loads(storage.read_bytes(storage.join(_folder(), name))))
            except (OSError, ValueError):
                continue
    return found
