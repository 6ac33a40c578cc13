"""``RouteServer``: the one deployment of a route of registry versions (one version, a weighted split,
a shadow, a rollout's steps).

Each replica holds every version the route names and picks one per request in its own process: the
key's point in the split (``traffic.point``), then that version's batched forward, as a one-version
route answers. No second Serve handle call, no second process on the request path (a router
deployment in front of the versions cost 7 of every 8 requests a second, saturated on 2 cores).
Every replica holds every version, so the route autoscales as one: its replicas follow the route's
whole load, whatever the shares (``ServeSettings(num_replicas="auto")``).

The split is the deployment's ``user_config``: a new split (``set_split``, a rollout's step, a roll
back) is a reconfiguration in place. The versions it names are loaded first, on a thread, and the
split, the versions and the loaded models change in one assignment, so a request sees the old
route or the new one, whole; none is dropped. During a rollout each replica sends the candidate's
and the baseline's figures (latency, failed) to the rollout controller every half second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
import traceback
from typing import Any, NamedTuple

from raymodel._internal.name_rules import parse_ref
from raymodel.exceptions import RegistryError
from raymodel.serve._llm.openai import not_found
from raymodel.serve._replica.deployment import ModelReplica, answers_in_pieces, json_response
from raymodel.serve._routes.plan import RoutePlan, RouteSpec
from raymodel.serve._routes.traffic import (
    KEY_HEADER,
    MODEL_HEADER,
    REPLICA_HEADER,
    VersionStats,
    check_split,
    compare,
    pick,
    point,
    window_figures,
)

logger = logging.getLogger("ray.serve")

#: How often a replica of a route being rolled out sends its figures to the rollout controller.
REPORT_S = 0.5
#: Shadow copies a replica runs at once at most; more are not sent (saturated, the shadow would
#: otherwise queue work without end and take the answered requests' CPU).
MAX_SHADOWS = 32


class _Route(NamedTuple):
    """What a request reads, swapped whole: the split's shares, each reference's version, the models."""

    shares: list[tuple[str, float]]
    labels: dict[str, str]  # reference -> "key:N"
    models: dict[str, Any]  # "key:N" -> the loaded model


class RouteServer(ModelReplica):
    """A replica of a route of registry versions (see the module's docstring)."""

    def __init__(
        self,
        plan: RoutePlan,
        info: dict[str, Any],
        max_batch_size: int,
        batch_wait_timeout_s: float,
        max_body_bytes: int,
        settings: Any = None,
    ) -> None:
        from raymodel.registry import Registry

        api, keys = getattr(settings, "api", "raymodel"), getattr(settings, "api_keys", None)
        super().__init__({}, info, max_batch_size, batch_wait_timeout_s, max_body_bytes, api, keys)
        self.plan = plan
        self.settings = settings
        self.registry = Registry(plan.registry)
        self.figures = VersionStats()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.rollout: str | None = None  # the id of the rollout this route is in, if any
        self._pending: dict[str, list[tuple[float, bool]]] = {}  # figures not yet sent to the controller
        self._pending_lock = threading.Lock()
        self._lock = threading.Lock()  # one change of the route at a time (a reconfiguration, the follower)
        self.route = _Route([], {}, {})  # Serve calls ``reconfigure`` with the split before the first request
        threading.Thread(target=self._follow, name="raymodel-follow", daemon=True).start()
        threading.Thread(target=self._report, name="raymodel-report", daemon=True).start()

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """A new split (and the rollout it belongs to) from Serve's ``user_config``: no restart. Checked
        here too: a Serve config file's ``user_config`` reaches the replica unchecked by raymodel."""
        shares = list(check_split(config["split"]).items())
        await asyncio.get_running_loop().run_in_executor(None, self._apply, shares)
        self.rollout = config.get("rollout")
        logger.info("split now %s%s", shares, f" (rollout {self.rollout})" if self.rollout else "")

    async def take(self, config: dict[str, Any]) -> None:
        """The split handed over directly, when Serve has not reconfigured this replica with it in
        time (``Servable.apply``): what ``reconfigure`` does; taking the split held is a no-op."""
        if (dict(self.route.shares), self.rollout) != (config["split"], config.get("rollout")):
            await self.reconfigure(config)

    # ------------------------------------------------------------ references
    def _refs(self, shares: list[tuple[str, float]]) -> list[str]:
        return [ref for ref, _ in shares] + ([self.plan.shadow] if self.plan.shadow else [])

    def _apply(self, shares: list[tuple[str, float]] | None) -> dict[str, str]:
        """Resolve every reference of ``shares`` (and the shadow), load the versions not held yet, then
        swap the route whole. Versions no reference names any more are let go. ``None``: the route's
        shares as they are once no other change runs (an alias followed), so that following never puts
        back a split that a reconfiguration replaced meanwhile. The references that name another
        version now, with it."""
        from raymodel.registry import sources

        with self._lock:
            if shares is None:
                if not self.route.shares:  # nothing to follow before Serve's first reconfiguration
                    return {}
                shares = self.route.shares
            before, labels = self.route.labels, {}
            for ref in self._refs(shares):
                key, version = parse_ref(ref)
                labels[ref] = f"{key}:{self.registry.resolve(key, version)}"
            held = self.route.models
            models = {}
            for label in set(labels.values()):
                if label in held:
                    models[label] = held[label]
                else:
                    key, n = label.rsplit(":", 1)
                    models[label] = sources.load({"registry": self.registry.uri, "key": key}, int(n))
                    self.loads += 1
            self.route = _Route(shares, labels, models)
            return {ref: label for ref, label in labels.items() if before.get(ref, label) != label}

    def _follow(self) -> None:
        """An alias (or a key's newest version) that moves is followed: the new version is loaded
        first, then requests go to it."""
        while True:
            time.sleep(self.plan.poll_s)
            try:
                self._follow_once()
            except Exception:  # noqa: BLE001 - a registry hiccup never stops the route
                logger.warning("could not follow the route's references\n%s", traceback.format_exc())

    def _follow_once(self) -> dict[str, str]:
        """One look at the route's references: those that name another version now, with it."""
        moved = self._apply(None)
        for ref, label in moved.items():
            logger.info("%s now names %s", ref, label)
        return moved

    # ------------------------------------------------------------------ HTTP
    async def __call__(self, request: Any) -> Any:
        payload, answer = await self.opened(request)
        if answer is not None:
            return answer
        route = self.route
        label = route.labels[pick(route.shares, point(request.headers.get(KEY_HEADER)))]
        model = route.models[label]
        generated = await self.own_generation(payload, model, label)
        if generated is not None:  # a causal LM's prompt: decoded in the engine's batch
            return generated
        if isinstance(payload, dict) and payload.get("stream") is True and answers_in_pieces(model):
            return self._stream(payload, model)
        began = time.monotonic()
        failed = True
        try:
            status, content, size, _ = await self._answer(payload, model)
            failed = status >= 500
        finally:
            self._count(label, time.monotonic() - began, failed)
        shadow = self.plan.shadow
        if shadow and len(self.tasks) < MAX_SHADOWS and random.random() < self.plan.shadow_fraction:
            task = asyncio.get_running_loop().create_task(self._shadow(route, shadow, payload, label, status, content))
            self.tasks.add(task)  # kept until done: the loop holds tasks weakly
            task.add_done_callback(self.tasks.discard)
        headers = {"x-raymodel-batch-size": str(size), MODEL_HEADER: label, REPLICA_HEADER: str(os.getpid())}
        return json_response(content, status, headers)

    # ---------------------------------------------------------- OpenAI's API
    def model_ids(self) -> list[str]:
        """The references the route serves as written (``poet@production``), then the versions they name."""
        route = self.route
        refs = [ref for ref, _ in route.shares]
        return list(dict.fromkeys([*refs, *(route.labels[ref] for ref in refs)]))

    async def choose(self, name: str, request: dict[str, Any]) -> tuple[str, Any, str | None]:
        """A request naming the route's key (any of its ids, or another version or alias of that key:
        the split's references change during a rollout, the clients' ``model`` does not) is answered by
        the version the split picks, sticky by the ``x-raymodel-key`` header, else the request's ``user``."""
        route = self.route
        try:
            named = parse_ref(name)[0]
        except (RegistryError, ValueError):
            named = None
        if name not in self.model_ids() and named not in {parse_ref(ref)[0] for ref, _ in route.shares}:
            raise not_found(name, self.model_ids())
        label = route.labels[pick(route.shares, point(request.get("key")))]
        return label, route.models[label], None

    def record(self, label: str, latency_s: float, failed: bool) -> None:
        self._count(label, latency_s, failed)

    def held_models(self) -> list[Any]:
        return list(self.route.models.values())

    async def predict(self, payload: Any) -> Any:
        """In-cluster calls through a Serve handle (the split's choice, no key: random)."""
        route = self.route
        label = route.labels[pick(route.shares, point(None))]
        status, content, _, _ = await self._answer(payload, route.models[label])
        if status != 200:
            raise RuntimeError(f"{content['error']}: {content['detail']}")
        return content

    def openapi(self) -> dict[str, Any]:
        from raymodel.contract.schema import openapi

        route = self.route
        label = route.labels[route.shares[0][0]]
        model = route.models[label]
        return openapi(type(model), self.info.get("route") or "/", f"{type(model).__name__} (raymodel)", label)

    async def _shadow(
        self, route: _Route, shadow: str, payload: Any, answered_label: str, status: int, answered: Any
    ) -> None:
        label = route.labels[shadow]
        try:
            s_status, s_content, _, _ = await self._answer(payload, route.models[label])
        except Exception:  # noqa: BLE001 - a shadow's failure is counted, never the client's
            s_status, s_content = 500, None
        if status == 200 and s_status == 200:
            agree, diffs = compare(answered, s_content)
            self.figures.record_shadow(label, answered_label, agree, diffs, False)
        else:
            self.figures.record_shadow(label, answered_label, None, [], s_status >= 500)

    # ---------------------------------------------------------------- figures
    def _count(self, label: str, latency_s: float, failed: bool) -> None:
        self.figures.record(label, latency_s, failed)
        if self.rollout is not None:
            with self._pending_lock:
                self._pending.setdefault(label, []).append((1000 * latency_s, failed))

    def _report(self) -> None:
        """Send the figures of a route being rolled out to the rollout controller, every ``REPORT_S``."""
        from raymodel.serve._rollouts.rollout import controller

        handle = None
        while True:
            time.sleep(REPORT_S)
            rollout = self.rollout
            with self._pending_lock:
                pending, self._pending = self._pending, {}
            if rollout is None or not pending:
                continue
            try:
                handle = handle or controller()
                handle.report.remote(rollout, pending)
            except Exception:  # noqa: BLE001 - the controller may be gone (the rollout ended): figures are dropped
                handle = None
                logger.debug("could not report figures of rollout %s\n%s", rollout, traceback.format_exc())

    def spec(self) -> RouteSpec:
        """What a rollout controller needs to redeploy this route."""
        return RouteSpec(self.plan.with_split(dict(self.route.shares)), self.settings, self.rollout)

    def describe(self) -> dict[str, Any]:
        route = self.route
        figures = self.figures.summary()
        refs = {ref: route.labels.get(ref) for ref in self._refs(route.shares)}
        return {
            **self.info,
            "serving": refs[route.shares[0][0]] if len(route.shares) == 1 else refs,
            "split": dict(route.shares),
            "refs": refs,
            "shadow": self.plan.shadow,
            "shadow_fraction": self.plan.shadow_fraction if self.plan.shadow else None,
            "rollout": self.rollout,
            "loaded": sorted(route.models),
            "loads": self.loads,
            **self.replica_info(),
            "versions": figures["versions"],
            "shadows": figures["shadow"],
            "window_s": figures["window_s"],
        }

    def stats(self, window_s: float = 60.0) -> dict[str, Any]:
        """The dashboard's figures over the last ``window_s`` seconds: the whole route's (this
        replica's), from the requests it answered, and per version."""
        figures = self.figures.summary(window_s)
        versions = figures["versions"]
        return {
            "route": self.info.get("route"),
            "serving": ", ".join(sorted(versions)) or ", ".join(sorted(set(self.route.labels.values()))),
            **window_figures(self.figures.answered(), list(self.batch_sizes), window_s, self.figures.started),
            "versions": versions,
            "shadows": figures["shadow"],
            "split": dict(self.route.shares),
            "refs": {ref: self.route.labels.get(ref) for ref in self._refs(self.route.shares)},
            "rollout": self.rollout,
        }
