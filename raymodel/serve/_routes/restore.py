"""After a head restart on the same storage: the declared routes of registry versions served again
(``declared.py``), and the rollouts that were running taken up by a new controller, which goes on
from each one's step (``serve/_rollouts/controller.py``). The training server calls ``restore`` when it starts
on a new head and finds an earlier head's records (``jobs/_server/recovery.py``)."""

from __future__ import annotations

from raymodel.serve._driver import Servable
from raymodel.serve._rollouts.controller import running_kept
from raymodel.serve._rollouts.rollout import controller
from raymodel.serve._routes.declared import declared


def serve_declared() -> list[str]:
    """Serve each declared route whose application is not running; the routes served, and for each
    that could not be, why (it stays declared: the next start tries again)."""
    from ray import serve

    try:
        running = set(serve.status().applications)
    except Exception:  # noqa: BLE001 - Serve not started yet: nothing runs
        running = set()
    done = []
    for d in declared():
        if d["name"] in running:
            continue
        try:
            Servable(
                d["what"],
                d["route"],
                settings=d["settings"],
                registry=d["registry"],
                shadow=d["shadow"],
                shadow_fraction=d["shadow_fraction"],
            ).deploy()
            done.append(f"{d['route']} serves {d['what']} again")
        except Exception as exc:  # noqa: BLE001 - one route's failure does not keep the others down
            done.append(f"{d['route']} could not be served again: {type(exc).__name__}: {exc}")
    return done


def restore() -> list[str]:
    """After a head restart on the same storage: each declared route served again, then the rollout
    controller started when a rollout was running (it goes on from its step); what was done, in words."""
    import ray

    running = running_kept()
    if not declared() and not running:  # (Serve's modules are not even imported)
        return []
    said = serve_declared()
    if running:
        ray.get(controller(Servable).running.remote(""))  # started: it takes up what it finds running
        said.append(f"rollouts going on: {', '.join(running)}")
    return said
