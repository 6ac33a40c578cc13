"""Warm pools: the pools the training server starts before any job asks (``--warm torch:2``).

``raymodel server start --warm torch:2,lightning:1`` (or ``rm.init(warm=...)``, or
``RAYMODEL_WARM``) names a backend and a number of workers for each pool. The
server starts them in the background once it is up, each as a job of that
backend with default placement would (``TrainSettings(num_workers=n)``: one CPU
per worker): a job with those settings, of that backend or another of its pool
kind (torch's: Lightning, transformers), takes the pool, ready or still starting,
instead of starting one of its own. A warm pool does not end for being idle; it
ends when other work needs its resources, and starts again once the server has
had no job and the cluster room for it for a while (``jobs/_pools/keeper.py``).

A backend without pools is warmed by name alone (``--warm torch:2,rllib``): the server's next job
runner starts ahead what its job would start (``WarmUp.runner_call``: RLlib's, the Algorithm's actor
with RLlib imported), holding no resources while it waits.

Without a setting, the default is ``auto``: a pool of 2 workers (1 on a one-CPU
cluster) for the backend of each model class the process has defined (RLlib's
warmed by name: it has no pool), or for torch where it has defined none, and,
where the cluster's CPUs have room for both, a pool of 1 worker of each too;
``none`` warms nothing. Pools of one kind start one after another, in the order
given (``PoolKeeper._behind``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Sequence

from raymodel.exceptions import SettingsError

#: ``(backend name, workers)`` of each warm pool; ``(name, 0)``: a backend without pools, warmed by name.
WarmSpec = tuple[str, int]

ENV = "RAYMODEL_WARM"


def parse_warm(value: str | Sequence[WarmSpec] | None, cpus: float) -> tuple[WarmSpec, ...]:
    """The warm pools ``value`` names: ``"torch:2,lightning:1"``, ``[("torch", 2)]``, ``"auto"`` (the
    default for a cluster of ``cpus`` CPUs), or ``"none"``/``""``. ``None`` reads ``RAYMODEL_WARM``
    (``auto`` when unset). A bad value is a ``SettingsError`` that says what is wrong."""
    if value is None:
        value = os.environ.get(ENV, "auto")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "none", "off", "0"):
            return ()
        if text == "auto":
            return default_warm(cpus)
        pairs: list[tuple[str, Any]] = []
        for part in (p.strip() for p in text.split(",") if p.strip()):
            name, sep, count = part.partition(":")
            if not sep and part in by_name():
                pairs.append((part, 0))
                continue
            if not sep:
                raise SettingsError(
                    f"Warm pool `{part}` needs a number of workers: BACKEND:WORKERS, e.g. `torch:2` "
                    "(several: `torch:2,lightning:1`; none: `none`)."
                )
            pairs.append((name.strip(), count.strip()))
    else:
        pairs = [tuple(p) for p in value]  # type: ignore[misc]
    return tuple(_checked(name, count) for name, count in pairs)


def _checked(name: str, count: Any) -> WarmSpec:
    poolable = pool_backends()
    if name in by_name():
        if count == 0:
            return name, 0
        raise SettingsError(
            f"Warm `{name}:{count}`: {name} has no pool of workers to size; write `{name}` alone (its job's "
            "runner starts its process ahead)."
        )
    if name not in poolable:
        raise SettingsError(
            f"No backend `{name}` runs on pools: warm one of {', '.join(sorted(poolable))}, or "
            f"{', '.join(sorted(by_name())) or 'none'} by name alone."
        )
    try:
        workers = int(count)
    except (TypeError, ValueError):
        workers = 0
    if isinstance(count, bool) or workers < 1 or str(workers) != str(count).strip():
        raise SettingsError(f"Warm pool `{name}:{count}`: the number of workers must be a whole number >= 1.")
    return name, workers


def pool_backends() -> dict[str, Any]:
    """``{name: Backend}`` of every registered backend that runs on pools."""
    from raymodel.contract import backends

    return {b.name: b for b in backends() if b.pool is not None}


def by_name() -> dict[str, Any]:
    """``{name: Backend}`` of every registered backend without pools that its job's runner warms
    (``WarmUp.runner_call``): warmed by name alone."""
    from raymodel.contract import backends

    return {b.name: b for b in backends() if b.pool is None and b.warm_up.runner_call}


def default_warm(cpus: float) -> tuple[WarmSpec, ...]:
    """``auto``: a pool of 2 workers (1 on a one-CPU cluster) for the backend of each model class this
    process has defined (RLlib's by name: it has no pool), or for torch where it has defined none and
    torch is installed; as many as the cluster's CPUs hold. Where the CPUs hold more, a pool of 1 worker
    of each such backend too (it starts once the 2-worker pool of its kind is ready)."""
    from raymodel.contract import defined_backends
    from raymodel.jobs._request import pool_kind

    poolable = pool_backends()
    names = [n for n in defined_backends() if n in poolable]
    if not defined_backends() and importlib.util.find_spec("torch") is not None:
        names = ["torch"]
    out: list[WarmSpec] = [(n, 0) for n in dict.fromkeys(defined_backends()) if n in by_name()]
    left = int(cpus)
    kinds: set[str] = set()
    for name in names:
        if left < 1:
            break
        kind = pool_kind(poolable[name])
        if kind in kinds:  # Lightning's after torch's: one pool takes the jobs of both
            continue
        kinds.add(kind)
        out.append((name, min(2, left)))
        left -= out[-1][1]
    for name, workers in list(out):  # room for both: a 1-worker job after a 2-worker one finds its own
        if workers == 2 and left >= 1:
            out.append((name, 1))
            left -= 1
    return tuple(out)


def warm_pool(name: str, workers: int) -> tuple[dict[str, Any], dict[str, float]]:
    """``(pool spec, needs)`` of a warm pool: what a job of backend ``name`` with
    ``TrainSettings(num_workers=workers)`` asks for (``jobs/_request.py``), so that such a job takes it."""
    from raymodel.jobs._request import pool_spec
    from raymodel.train import TrainSettings, worker_resources

    backend = pool_backends()[name]
    settings = TrainSettings(num_workers=workers)
    per_worker = worker_resources(settings.resources_per_worker, settings.use_gpu)
    return pool_spec(backend, settings, per_worker), dict(backend.training.needs(settings))


def warm_pools(specs: Sequence[WarmSpec]) -> dict[str, tuple[dict[str, Any], dict[str, float]]]:
    """``{pool key: (pool spec, needs)}`` of ``specs``: ``torch:2,lightning:2`` is one pool (torch's kind),
    whose workers import what a first job of each would."""
    out: dict[str, tuple[dict[str, Any], dict[str, float]]] = {}
    for name, workers in specs:
        if name not in pool_backends():  # warmed by name: no pool
            continue
        spec, needs = warm_pool(name, int(workers))
        if spec["key"] in out:
            earlier = out[spec["key"]][0]
            spec = {**spec, **{k: tuple(dict.fromkeys((*earlier[k], *spec[k]))) for k in ("imports", "names")}}
        out[spec["key"]] = (spec, needs)
    return out


def runner_imports(names: Sequence[str]) -> tuple[str, ...]:
    """What a job of each backend in ``names`` imports in its runner: the framework's modules and the
    backend's own as its payload is unpickled, then its ``WarmUp.runner_imports`` as its model is set up to take the
    submitted weights (a job's runner imports them ahead: ``JobRunner.warm``)."""
    poolable = pool_backends()
    found = [poolable[name] for name in dict.fromkeys(names) if name in poolable]
    return tuple(dict.fromkeys(m for b in found for m in (*b.imports, type(b).__module__, *b.warm_up.runner_imports)))


def runner_warms(specs: Sequence[WarmSpec]) -> tuple[str, ...]:
    """The ``WarmUp.runner_call`` of the backends in ``specs`` warmed by name (``jobs/_server/runner.py``)."""
    warmed = by_name()
    return tuple(dict.fromkeys(warmed[name].warm_up.runner_call for name, _ in specs if name in warmed))


def cpus_needed(specs: Sequence[WarmSpec]) -> float:
    """The CPUs the warm pools of ``specs`` hold together, once all are started (``torch:2,lightning:2``:
    one pool, which takes the jobs of both)."""
    return sum(needs.get("CPU", 0.0) for _, needs in warm_pools(specs).values())


def shown(specs: Sequence[WarmSpec]) -> str:
    return ",".join(f"{name}:{n}" if n else name for name, n in specs) or "none"
