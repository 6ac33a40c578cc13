"""The Serve deployment: one replica of a model behind HTTP, with adaptive batching.

Request path: JSON body -> ``preprocess`` (per request) -> stacked along the
batch dimension -> one ``forward`` -> split -> ``postprocess`` (per request).
A payload that ``preprocess`` rejects answers 422 before it joins a batch; if
a whole batch's ``forward`` fails, each request is retried alone, so only the
bad one fails.
"""

from __future__ import annotations

import collections
import json
import logging
import traceback
import uuid
from typing import Any

from ray import serve

from raymodel.backends.base import batch_len, to_jsonable

logger = logging.getLogger("ray.serve")

CLIENT_ERRORS = (ValueError, TypeError, KeyError)


class _Failed:
    """A per-request failure travelling through the batch in place of an output."""

    def __init__(self, exc: BaseException, request_id: str) -> None:
        self.exc, self.request_id = exc, request_id
        self.trace = "".join(traceback.format_exception(exc))


class ModelServer:
    """One replica: loads the model from a checkpoint and answers requests."""

    def __init__(self, checkpoint: str, info: dict[str, Any], max_batch_size: int, batch_wait_timeout_s: float,
                 max_body_bytes: int) -> None:
        from raymodel.model import RayModel

        self.model = RayModel.from_checkpoint(checkpoint)
        self.model.ensure_setup()
        self.info = info
        self.max_body_bytes = max_body_bytes
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=1000)
        self._batched.set_max_batch_size(max_batch_size)
        self._batched.set_batch_wait_timeout_s(batch_wait_timeout_s)

    # ------------------------------------------------------------------ HTTP
    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        sub = request.url.path[len(request.scope.get("root_path", "")):].strip("/")
        if sub in ("health", "info"):
            if request.method != "GET":
                return _error(405, "method not allowed", f"`{sub}` answers GET.", headers={"Allow": "GET"})
            if sub == "health":
                return JSONResponse({"status": "ok"})
            return JSONResponse({**self.info, "batch_sizes_seen": sorted(set(self.batch_sizes)),
                                 "mean_batch_size": sum(self.batch_sizes) / max(1, len(self.batch_sizes))})
        if sub:
            return _error(404, "not found", f"No endpoint `{sub}`; POST to the route, or GET `health` or `info`.")
        if request.method != "POST":
            return _error(405, "method not allowed", "POST a JSON body to this route.", headers={"Allow": "POST"})
        body = await request.body()
        if len(body) > self.max_body_bytes:
            return _error(413, "payload too large", f"The body has {len(body)} bytes; the limit is "
                                                    f"{self.max_body_bytes} (`ServeSettings(max_body_bytes=...)`).")
        try:
            payload = json.loads(body)
        except ValueError as exc:
            return _error(400, "invalid JSON", f"The body is not valid JSON: {exc}")
        status, content, size = await self._answer(payload)
        return JSONResponse(content, status_code=status, headers={"x-raymodel-batch-size": str(size)})

    async def predict(self, payload: Any) -> Any:
        """In-cluster calls through a Serve handle: the same path, minus HTTP."""
        status, content, _ = await self._answer(payload)
        if status != 200:
            raise RuntimeError(f"{content['error']}: {content['detail']}")
        return content

    # -------------------------------------------------------------- the model
    async def _answer(self, payload: Any) -> tuple[int, Any, int]:
        request_id = uuid.uuid4().hex[:12]
        try:
            x = self.model.preprocess(payload)
        except CLIENT_ERRORS as exc:
            return 422, {"error": "invalid payload", "detail": _message(exc)}, 0
        except Exception as exc:  # noqa: BLE001 - a bug in preprocess is the server's fault
            logger.error("request %s: preprocess failed\n%s", request_id, traceback.format_exc())
            return 500, {"error": "model error", "detail": _message(exc), "request_id": request_id}, 0
        output, size = await self._batched((x, request_id))
        if isinstance(output, _Failed):
            logger.error("request %s failed\n%s", request_id, output.trace)
            return 500, {"error": "model error", "detail": _message(output.exc), "request_id": request_id}, size
        return 200, output, size

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def _batched(self, items: list[tuple[Any, str]]) -> list[tuple[Any, int]]:
        self.batch_sizes.append(len(items))
        inputs = [x for x, _ in items]
        try:
            outputs = self._forward_many(inputs)
        except Exception:  # noqa: BLE001 - find the culprit: each request alone
            outputs = []
            for x, request_id in items:
                try:
                    outputs.append(self._forward_many([x])[0])
                except Exception as exc:  # noqa: BLE001
                    outputs.append(_Failed(exc, request_id))
        results = []
        for out, (_, request_id) in zip(outputs, items):
            if not isinstance(out, _Failed):
                try:
                    out = to_jsonable(self.model.postprocess(out))
                except Exception as exc:  # noqa: BLE001
                    out = _Failed(exc, request_id)
            results.append((out, len(items)))
        return results

    def _forward_many(self, inputs: list[Any]) -> list[Any]:
        backend = self.model.backend
        sizes = [batch_len(x) for x in inputs]
        batch = backend.stack(inputs)
        with backend.inference(self.model):
            output = self.model.forward(batch)
        return backend.split(output, sizes)


def _message(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _error(status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)
