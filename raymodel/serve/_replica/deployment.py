"""The Serve deployment: one replica of a model behind HTTP, with adaptive batching.

Request path: JSON body (one ``orjson`` decode) -> ``input_schema`` ->
``preprocess`` (per request) -> stacked along the batch dimension -> one
``forward`` -> split -> ``postprocess`` -> ``output_schema`` (per request) ->
one ``orjson`` encode. A payload that the input schema or ``preprocess``
rejects answers 422 before it joins a batch; if a whole batch's ``forward``
fails, each request is retried alone, so only the bad one fails.

Where a batch runs: the event loop is also Serve's own (with
``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``), so a model whose batches take
long runs them on the replica's one forward thread, and the loop keeps taking
requests and answering health checks meanwhile. A batch that uses less CPU than
``INLINE_BATCH_S`` (a small model's; and waits little, ``INLINE_WALL_S``) runs on the loop itself: handing it to a
thread and back costs more than the batch (the GIL changes hands twice, and the
loop waits for it; docs/performance.md, "Serving: where the time goes"). The batches
themselves: ``batching.py``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import time
import traceback
import uuid
from typing import Any

import orjson
from ray import serve
from starlette.responses import Response, StreamingResponse

from raymodel._internal import signature
from raymodel._ray import cluster
from raymodel.contract import Inference, text_generation
from raymodel.contract.schema import describe, openapi, schemas_of
from raymodel.exceptions import DataError
from raymodel.registry import sources
from raymodel.serve._llm.openai import not_found
from raymodel.serve._llm.routes import OpenAIRoutes
from raymodel.serve._replica.batching import BatchRunner, Failed, run_batch
from raymodel.serve._routes.traffic import window_figures

logger = logging.getLogger("ray.serve")

CLIENT_ERRORS = (ValueError, TypeError, KeyError)
_END = object()  # the end of a streamed answer


class ModelReplica(OpenAIRoutes):
    """One replica: loads its model from a checkpoint and answers requests (a route of registry
    versions is a ``RouteServer``, which answers the same way with the version it picks); with
    ``api="openai"``, OpenAI's API under the route (``serve/_llm/routes.py``)."""

    def __init__(
        self,
        source: dict[str, Any],
        info: dict[str, Any],
        max_batch_size: int,
        batch_wait_timeout_s: float,
        max_body_bytes: int,
        api: str = "raymodel",
        keys: tuple[str, ...] | None = None,
    ) -> None:
        self.api, self.keys, self.max_generation_batch = api, keys, max_batch_size
        self.source = source
        self.model = sources.load(source, source.get("version")) if source else None  # None: per request
        self.info = info
        self.max_body_bytes = max_body_bytes
        self.batch_sizes: collections.deque[tuple[float, int]] = collections.deque(maxlen=1000)  # (end, size)
        self.requests: collections.deque[tuple[float, float]] = collections.deque(maxlen=5000)  # (end, latency s)
        self.started = time.time()
        self.loads = 0  # versions this replica has loaded (a route of several)
        self._warned_at = -60.0
        self.ingress = _ingress()
        self.threads = cluster.set_threads(_cpu_share())
        self._runner = BatchRunner(run_batch)
        if self.ingress == "haproxy":
            _json_error_page()
        batched: Any = self._batched  # `@serve.batch`'s wrapper: this replica's sizes are set on it
        batched.set_max_batch_size(max_batch_size)
        batched.set_batch_wait_timeout_s(batch_wait_timeout_s)
        if api == "openai" and self.model is not None:
            text_generation(self.model)  # raises, naming what OpenAI's API serves

    # ------------------------------------------------------------------ HTTP
    async def __call__(self, request: Any) -> Any:
        payload, answer = await self.opened(request)
        if answer is not None:
            return answer
        generated = await self.own_generation(payload, self.model, answered_by(self.model))
        if generated is not None:  # a causal LM's prompt: decoded in the engine's batch
            return generated
        if isinstance(payload, dict) and payload.get("stream") is True and answers_in_pieces(self.model):
            return self._stream(payload)
        status, content, size, model = await self._answer(payload)
        return json_response(
            content, status, {"x-raymodel-batch-size": str(size), "x-raymodel-model": answered_by(model)}
        )

    async def opened(self, request: Any) -> tuple[Any, Any]:
        """``(the request's JSON payload, None)``, or ``(None, the answer)`` to a request the replica
        answers before its model does: ``front``'s, ``openapi.json``, a body it refuses."""
        sub, answer = await self.front(request)
        if answer is not None:
            return None, answer
        if sub == "openapi.json":
            return None, json_response(self.openapi())
        return await read_payload(request, sub, self.max_body_bytes)

    async def front(self, request: Any) -> tuple[str, Any]:
        """``(the path below the route, an answer or None)``: what every replica answers before its own
        requests: the key, ``health`` and the methods, ``info``, and on an OpenAI route all the rest."""
        refused = self.authorized(request)
        if refused is not None:
            return "", refused
        sub, answer = described(request)
        if answer is None and sub == "info":
            answer = json_response(self.describe())
        if answer is None and self.api == "openai":
            answer = await self.openai_call(request, sub)
        return sub, answer

    def describe(self) -> dict[str, Any]:
        """``GET <route>/info``."""
        return {**self.info, "serving": answered_by(self.model), **self.replica_info()}

    def model_ids(self) -> list[str]:
        return [type(self.model).__name__]

    async def choose(self, name: str, request: dict[str, Any]) -> tuple[str, Any, str | None]:
        if name not in self.model_ids():
            raise not_found(name, self.model_ids())
        return name, self.model, None

    def record(self, label: str, latency_s: float, failed: bool) -> None:
        self.requests.append((time.time(), latency_s))

    def held_models(self) -> list[Any]:
        return [self.model]

    def replica_info(self) -> dict[str, Any]:
        """This replica's part of ``GET <route>/info``: the ingress, its process, threads and batches."""
        return {
            "ingress": self.ingress,
            "replica_pid": os.getpid(),
            "torch_threads": self.threads,
            "batches_run_on": self._runner.where(),
            "batch_sizes_seen": sorted({size for _, size in list(self.batch_sizes)}),
            "mean_batch_size": window_figures((), list(self.batch_sizes), math.inf, self.started)["mean_batch_size"],
        }

    def _stream(self, payload: dict[str, Any], model: Any = None) -> Any:
        """``{"stream": true, ...}``: the model's answer piece by piece as server-sent events, one
        ``data: {"token": ...}`` event each, then ``data: [DONE]``. A request the model refuses is a 422
        before the stream starts; a failure after it is an ``event: error``."""
        model = model or self.model
        began = time.monotonic()
        try:
            pieces = iter(model.backend.inference.stream(model, payload))
        except CLIENT_ERRORS as exc:
            return error_response(422, "invalid payload", _message(exc))

        async def events() -> Any:
            loop = asyncio.get_running_loop()
            try:
                while True:
                    piece = await loop.run_in_executor(None, next, pieces, _END)
                    if piece is _END:
                        break
                    yield b"data: " + orjson.dumps({"token": piece}) + b"\n\n"
                yield b"data: [DONE]\n\n"
            except Exception as exc:  # noqa: BLE001 - the status line is sent: the error is an event
                logger.error("a streamed answer failed\n%s", traceback.format_exc())
                yield (
                    b"event: error\ndata: " + orjson.dumps({"error": "model error", "detail": _message(exc)}) + b"\n\n"
                )
            finally:
                self.requests.append((time.time(), time.monotonic() - began))

        headers = {"x-raymodel-model": answered_by(model), "Cache-Control": "no-cache"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def predict(self, payload: Any) -> Any:
        """In-cluster calls through a Serve handle: the same path, minus HTTP."""
        status, content, _, _ = await self._answer(payload)
        if status != 200:
            raise RuntimeError(f"{content['error']}: {content['detail']}")
        return content

    def openapi(self) -> dict[str, Any]:
        """The route's OpenAPI document, from the served model's ``input_schema`` / ``output_schema``."""
        model = self.model
        return openapi(
            type(model), self.info.get("route") or "/", f"{type(model).__name__} (raymodel)", answered_by(model) or "1"
        )

    def stats(self, window_s: float = 60.0) -> dict[str, Any]:
        """This replica's last ``window_s`` seconds: request rate, latency p50/p99, mean batch size."""
        return {
            "route": self.info.get("route"),
            "serving": answered_by(self.model),
            **window_figures(list(self.requests), list(self.batch_sizes), window_s, self.started),
        }

    # -------------------------------------------------------------- the model
    async def _answer(self, payload: Any, model: Any = None) -> tuple[int, Any, int, Any]:
        began = time.monotonic()
        try:
            return await self._respond(payload, model)
        finally:
            self.requests.append((time.time(), time.monotonic() - began))

    async def _respond(self, payload: Any, model: Any = None) -> tuple[int, Any, int, Any]:
        model = model or self.model  # this request's model, even if a new version is swapped in meanwhile
        payload, errors = schemas_of(type(model)).check_input(payload)
        if errors:
            return (
                422,
                {
                    "error": "invalid payload",
                    "detail": f"{len(errors)} field(s) do not match the input schema: {describe(errors)}",
                    "errors": errors,
                },
                0,
                model,
            )
        try:
            x = model.preprocess(payload)
        except CLIENT_ERRORS as exc:
            return 422, {"error": "invalid payload", "detail": _message(exc)}, 0, model
        except Exception as exc:  # noqa: BLE001 - a bug in preprocess is the server's fault
            request_id = _request_id()
            logger.error("request %s: preprocess failed\n%s", request_id, traceback.format_exc())
            return 500, {"error": "model error", "detail": _message(exc), "request_id": request_id}, 0, model
        if schemas_of(type(model)).input is None:  # a declared schema wins
            try:
                signature.check(signature.of_model(model), x, warn=self._warn_nonfinite)
            except DataError as exc:
                return 422, {"error": "invalid payload", "detail": str(exc)}, 0, model
        output, size = await self._batched((x, model))
        if isinstance(output, Failed) and isinstance(output.exc, DataError):  # the model's own check of its input
            return 422, {"error": "invalid payload", "detail": str(output.exc)}, size, model
        if isinstance(output, Failed):
            request_id = _request_id()
            logger.error("request %s failed\n%s", request_id, output.trace)
            return 500, {"error": "model error", "detail": _message(output.exc), "request_id": request_id}, size, model
        return 200, output, size, model

    def _warn_nonfinite(self, message: str) -> None:  # nonfinite="warn": logged at most once a minute
        if time.monotonic() - self._warned_at >= 60.0:
            self._warned_at = time.monotonic()
            logger.warning("a request's input: %s (answered anyway; logged at most once a minute)", message)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def _batched(self, items: list[tuple[Any, Any]]) -> list[tuple[Any, int]]:
        self.batch_sizes.append((time.time(), len(items)))
        return await self._runner(items)


def described(request: Any) -> tuple[str, Any]:
    """``(the path below the route, an answer or None)``: ``GET health`` is answered here, and another
    method on ``health``, ``info`` or ``openapi.json`` is a 405; the route answers the rest."""
    scope = request.scope
    sub = scope["path"][len(scope.get("root_path", "")) :].strip("/")
    if sub in ("health", "info", "openapi.json"):
        if request.method != "GET":
            return sub, error_response(405, "method not allowed", f"`{sub}` answers GET.", headers={"Allow": "GET"})
        if sub == "health":
            return sub, json_response({"status": "ok"})
    return sub, None


async def read_payload(request: Any, sub: str, max_body_bytes: int) -> tuple[Any, Any]:
    """``(payload, None)`` of a POST to the route itself, or ``(None, the error answer)``: 404 for another
    path, 405 for another method, 413 for a body over ``max_body_bytes``, 400 for one that is not JSON."""
    if sub:
        return None, error_response(
            404, "not found", f"No endpoint `{sub}`; POST to the route, or GET `health`, `info` or `openapi.json`."
        )
    if request.method != "POST":
        return None, error_response(
            405, "method not allowed", "POST a JSON body to this route.", headers={"Allow": "POST"}
        )
    body = await request.body()
    if len(body) > max_body_bytes:
        return None, error_response(
            413,
            "payload too large",
            f"The body has {len(body)} bytes; the limit is {max_body_bytes} (`ServeSettings(max_body_bytes=...)`).",
        )
    try:
        return orjson.loads(body), None
    except ValueError as exc:
        return None, error_response(400, "invalid JSON", f"The body is not valid JSON: {exc}")


def answers_in_pieces(model: Any) -> bool:
    """Whether the model's backend answers piece by piece (its ``Inference.stream`` overridden, as a causal
    LM's is); for any other model a ``"stream"`` key is the payload's own business."""
    return model is not None and type(model.backend.inference).stream is not Inference.stream


def _ingress() -> str:
    """How HTTP reaches this replica: Serve's HAProxy, a replica port itself, or Serve's Python proxy."""
    from ray.serve._private import constants

    if constants.RAY_SERVE_ENABLE_HA_PROXY:
        return "haproxy"
    return "direct" if constants.RAY_SERVE_ENABLE_DIRECT_INGRESS else "proxy"


def _cpu_share() -> float:
    import ray

    try:
        return float(ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0))
    except Exception:  # noqa: BLE001 - outside an actor (unit tests)
        return 1.0


HAPROXY_ERROR_BODY = orjson.dumps(
    {
        "error": "replica unavailable",
        "detail": ("The replica handling this request stopped before answering, or none is up; retry it."),
    }
)


def _json_error_page() -> None:
    """HAProxy's own answer when no replica can take a request (or one dies under it) is a page Ray
    writes once, as plain text, beside HAProxy's config on each node; here it is JSON like every
    other error of the route. HAProxy reads it on its next reload, which this replica's start causes."""
    import ray
    from ray.serve._private import constants

    folder, _ = os.path.split(constants.RAY_SERVE_HAPROXY_CONFIG_FILE_LOC)
    folder = os.path.join(folder, ray.get_runtime_context().get_node_id())  # Ray's files are per node
    page = (
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n%s"
        % (len(HAPROXY_ERROR_BODY), HAPROXY_ERROR_BODY)
    )
    try:
        os.makedirs(folder, exist_ok=True)
        staged = os.path.join(folder, f".500.http.{os.getpid()}")
        with open(staged, "wb") as f:
            f.write(page)
        os.replace(staged, os.path.join(folder, "500.http"))
    except OSError:  # HAProxy keeps Ray's plain-text page
        logger.warning("could not write HAProxy's JSON error page in %s", folder)


def _request_id() -> str:
    """The id Serve gave this request, which its answer carries as ``X-Request-ID`` and Serve's
    logs show: a failed request's body and raymodel's log line name it too."""
    try:
        from ray.serve.context import _get_serve_request_context

        request_id = _get_serve_request_context().request_id
    except Exception:  # noqa: BLE001 - outside a replica (unit tests)
        request_id = ""
    return request_id or uuid.uuid4().hex[:12]


def answered_by(model: Any) -> str:
    """What a response says it was answered by: ``key:version``, or the checkpoint's folder name."""
    source = model.source
    if "registry" in source:
        return str(source["registry"])
    return os.path.basename(str(source.get("checkpoint", "")).rstrip("/"))


def _message(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(content, option=JSON_OPTIONS), status_code=status, headers=headers, media_type="application/json"
    )


def error_response(status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> Any:
    return json_response({"error": error, "detail": detail}, status, headers)
