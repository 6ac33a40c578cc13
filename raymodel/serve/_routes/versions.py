"""The two deployments of a multiplexed route (``"digits@*"``, ``"*"``): any version, per request.

``ModelRouter`` is the route's HTTP ingress. Per request it resolves the ``x-raymodel-model``
header to a version, sends the payload to ``VersionServer`` through a Serve handle with that
version as the multiplexed model id, and answers with ``x-raymodel-model`` naming it. (A route of
versions known in advance, a split or a shadow, picks in process: ``server.RouteServer``.)

``VersionServer`` is a ``ModelReplica`` whose model is chosen per request: Serve's model
multiplexing keeps an LRU of ``max_models_per_replica`` versions per replica and its router sends
a request to a replica that has the version loaded. The multiplexed id goes by handle, not by
HTTP header: Ray's HAProxy ingress (raymodel's default) balances requests over replicas without
looking at the ``serve_multiplexed_model_id`` header (its config template only strips that header
when an ingress request router is configured), so the id is set where Serve's own router reads it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from typing import Any

from ray import serve

from raymodel._internal.name_rules import parse_ref
from raymodel.exceptions import RegistryError
from raymodel.serve._replica import auth
from raymodel.serve._replica.deployment import (
    ModelReplica,
    answered_by,
    described,
    error_response,
    json_response,
    read_payload,
)
from raymodel.serve._routes.plan import RoutePlan
from raymodel.serve._routes.traffic import MODEL_HEADER, REPLICA_HEADER, VersionStats, multiplexed_stats

logger = logging.getLogger("ray.serve")


class VersionServer(ModelReplica):
    """A replica serving whichever registry version (``key:N``) each request's multiplexed id names."""

    def __init__(
        self, registry: str, max_models: int, max_batch_size: int, batch_wait_timeout_s: float, max_body_bytes: int
    ) -> None:
        super().__init__({}, {}, max_batch_size, batch_wait_timeout_s, max_body_bytes)
        from ray.serve.multiplex import _ModelMultiplexWrapper

        self.registry = registry
        self.loads = 0  # versions this replica has loaded (a route that thrashes its LRU shows it here)
        # ``@serve.multiplexed`` fixes its LRU size where it decorates; this replica's comes from the
        # settings, so the wrapper the decorator would make on first use is made here with it.
        self._lru = _ModelMultiplexWrapper(VersionServer._load_version, self, max_models)  # type: ignore[arg-type]
        setattr(self, "__serve_multiplex_wrapper", self._lru)

    async def _load_version(self, label: str) -> Any:
        from raymodel.registry import sources

        key, version = parse_ref(label)
        source = {"registry": self.registry, "key": key}
        self.loads += 1
        return await asyncio.get_running_loop().run_in_executor(None, sources.load, source, version)

    @serve.multiplexed(max_num_models_per_replica=3)  # the marker Serve looks for; the LRU is `self._lru`
    async def _version(self, label: str) -> Any:
        return await self._load_version(label)

    async def answer(self, payload: Any) -> tuple[int, Any, int, int]:
        """The multiplexed version's answer: ``(status, JSON content, batch size, this replica's pid)``."""
        model = await self._version(serve.get_multiplexed_model_id())
        status, content, size, _ = await self._answer(payload, model)
        return status, content, size, os.getpid()

    async def warm(self) -> list[str]:
        """Load the request's version (a route's versions are loaded before its first request)."""
        await self._version(serve.get_multiplexed_model_id())
        return self.loaded()

    async def openapi_of(self, route: str) -> dict[str, Any]:
        from raymodel.contract.schema import openapi

        model = await self._version(serve.get_multiplexed_model_id())
        return openapi(type(model), route, f"{type(model).__name__} (raymodel)", answered_by(model))

    def loaded(self) -> list[str]:
        """The versions this replica holds, least recently used first."""
        return list(self._lru.models)

    def replica(self) -> dict[str, Any]:
        """This replica's process and the versions it holds (least recently used first)."""
        return {"pid": os.getpid(), "loaded": self.loaded(), "loads": self.loads}


class ModelRouter:
    """The HTTP ingress of a multiplexed route (see the module's docstring)."""

    def __init__(
        self,
        backend: Any,
        plan: RoutePlan,
        info: dict[str, Any],
        max_body_bytes: int,
        keys: tuple[str, ...] | None = None,
    ) -> None:
        from raymodel.registry import Registry

        self.keys = keys
        self.backend, self.plan, self.info = backend, plan, info
        self.max_body_bytes = max_body_bytes
        self.registry = Registry(plan.registry)
        self.handles: dict[str, Any] = {}
        self.cache: dict[str, tuple[float, Any]] = {}  # the header -> (when, label or error)
        self.figures = VersionStats()
        self.batches: collections.deque[tuple[float, int]] = collections.deque(maxlen=5000)  # (end, size)
        self.poll_s = float(plan.poll_s)

    def _choose(self, headers: Any) -> str | Any:
        """The label of the version a request names, or an error response (naming none, or none known)."""
        multiplex = self.plan.key
        wanted = headers.get(MODEL_HEADER) or (multiplex if multiplex != "*" else "")
        if not wanted:
            detail = f"Name a version in the `{MODEL_HEADER}` header, e.g. `digits:3`."
            return error_response(400, "no model named", detail)
        now = time.monotonic()
        hit = self.cache.get(wanted)
        if hit is None or now - hit[0] > self.poll_s:
            hit = self.cache[wanted] = (now, self._resolve_header(wanted, multiplex))
            if len(self.cache) > 1000:
                self.cache.pop(next(iter(self.cache)))
        label = hit[1]
        if isinstance(label, str):
            return label
        return error_response(404, "no such model", label["detail"])

    def _resolve_header(self, wanted: str, multiplex: str) -> Any:
        try:
            key, version = parse_ref(wanted)
            if multiplex != "*" and key != multiplex:
                raise RegistryError(f"This route serves versions of `{multiplex}` only (asked for `{wanted}`).")
            return f"{key}:{self.registry.resolve(key, version)}"
        except RegistryError as exc:
            detail = str(exc)
            try:
                key = parse_ref(wanted)[0] if multiplex == "*" else multiplex
                records = self.registry.list(key)
                detail += " Served here: " + ", ".join(
                    f"{r.key}:{r.version}" + "".join(f" ({r.key}@{a})" for a in r.aliases) for r in records
                )
            except Exception:  # noqa: BLE001 - the first message names what exists already
                pass
            return {"detail": detail}

    # ------------------------------------------------------------------ HTTP
    async def __call__(self, request: Any) -> Any:
        if not auth.allowed(self.keys, request.headers):
            return error_response(401, "unauthorized", auth.MISSING, headers=auth.CHALLENGE)
        sub, answer = described(request)
        if answer is not None:
            return answer
        if sub == "info":
            return json_response(await self.describe())
        if sub == "openapi.json":
            label = self._choose(request.headers)
            if not isinstance(label, str):
                return label
            call = self._to(label).openapi_of
            return json_response(await call.remote(self.info.get("route") or "/"))
        payload, refused = await read_payload(request, sub, self.max_body_bytes)
        if refused is not None:
            return refused
        label = self._choose(request.headers)
        if not isinstance(label, str):
            return label
        began = time.monotonic()
        status, content, size, pid = await self._to(label).answer.remote(payload)
        self.figures.record(label, time.monotonic() - began, status >= 500)
        self.batches.append((time.time(), int(size)))  # the size of the batch it was answered in
        return json_response(
            content, status, {"x-raymodel-batch-size": str(size), MODEL_HEADER: label, REPLICA_HEADER: str(pid)}
        )

    async def predict(self, payload: Any) -> Any:
        """In-cluster calls through a Serve handle: a multiplexed route of one key answers its newest version."""
        label = self._choose({})
        if not isinstance(label, str):
            raise RuntimeError(f"Name a version: {label.body.decode()}")
        status, content, _, _ = await self._to(label).answer.remote(payload)
        if status != 200:
            raise RuntimeError(f"{content['error']}: {content['detail']}")
        return content

    def _to(self, label: str) -> Any:
        """The versions deployment's handle for ``label`` (made once: ``options`` copies the handle)."""
        handle = self.handles.get(label)
        if handle is None:
            handle = self.handles[label] = self.backend.options(multiplexed_model_id=label)
            if len(self.handles) > 1000:
                self.handles.pop(next(iter(self.handles)))
        return handle

    # ---------------------------------------------------------------- figures
    async def describe(self) -> dict[str, Any]:
        figures = self.figures.summary()
        try:
            replica = await self.backend.replica.remote()
        except Exception:  # noqa: BLE001 - figures without the replica's list
            replica = {"pid": None, "loaded": None}
        return {
            **self.info,
            "multiplex": self.plan.multiplex,
            "loaded": replica["loaded"],
            "loads": replica.get("loads"),
            "replica_pid": replica["pid"],
            "router_pid": os.getpid(),
            "versions": figures["versions"],
            "window_s": figures["window_s"],
        }

    async def stats(self, window_s: float = 60.0) -> dict[str, Any]:
        """The dashboard's figures over the last ``window_s`` seconds: the whole route's, from the
        requests it answered (and the batch each was answered in), and per version."""
        return multiplexed_stats(self.info, self.figures, list(self.batches), window_s)
