"""What every replica class adds to answer OpenAI's API (``ServeSettings(api="openai")``): the
endpoints below the route, one text engine per model it holds (requests decode together in it), the
route's keys. A replica class says which model ids it serves (``model_ids``) and which of its models
answers a request (``choose``); ``openai.py`` does the rest."""

from __future__ import annotations

import time
import traceback
from typing import Any

import orjson

from raymodel.contract import text_generation
from raymodel.serve._llm import openai
from raymodel.serve._llm.openai import OpenAIError
from raymodel.serve._replica import auth

ENDPOINTS = ("completions", "chat/completions")


class OpenAIRoutes:
    """A mixin of ``ModelReplica`` and its subclasses (their ``max_body_bytes``, ``batch_sizes`` and
    ``started``)."""

    api: str = "raymodel"
    keys: tuple[str, ...] | None = None
    max_body_bytes: int
    batch_sizes: Any
    started: float

    def model_ids(self) -> list[str]:
        raise NotImplementedError

    async def choose(self, name: str, request: dict[str, Any]) -> tuple[str, Any, str | None]:
        """``(the id answering, its model, its adapter or None)`` for a request naming ``name``."""
        raise NotImplementedError

    def record(self, label: str, latency_s: float, failed: bool) -> None:
        """A request's figures (the route's, and per version where the route has several)."""
        raise NotImplementedError

    def held_models(self) -> list[Any]:
        """The models this replica holds now (their engines are kept; others' are closed)."""
        raise NotImplementedError

    def engine_of(self, model: Any) -> Any:
        """The model's text engine, made on first use (one per model held, its batches counted in
        ``batch_sizes`` as a step's size)."""
        engines: dict[int, tuple[Any, Any]] = self.__dict__.setdefault("_engines", {})
        held = engines.get(id(model))
        if held is not None and held[0] is model:
            return held[1]
        alive = {id(m) for m in self.held_models()}
        for key in [k for k in engines if k not in alive]:
            engines.pop(key)[1].close()
        max_batch = getattr(self, "max_generation_batch", 16)
        engine = text_generation(model).engine(model, max_batch, self._step)
        engines[id(model)] = (model, engine)
        return engine

    def _step(self, size: int) -> None:
        self.batch_sizes.append((time.time(), size))

    def authorized(self, request: Any) -> Any:
        """None when the request may go on, else the 401 (OpenAI's shape on an OpenAI route)."""
        if auth.allowed(self.keys, request.headers):
            return None
        if self.api == "openai":
            return openai.unauthorized()
        from starlette.responses import Response

        body = orjson.dumps({"error": "unauthorized", "detail": auth.MISSING})  # the route's own error shape
        return Response(body, 401, auth.CHALLENGE, media_type="application/json")

    async def openai_call(self, request: Any, sub: str) -> Any:
        """``GET models``, ``POST completions`` and ``POST chat/completions`` under the route."""
        try:
            if sub == "models":
                if request.method != "GET":
                    raise OpenAIError(405, "`/models` answers GET.")
                return openai.models(self.model_ids(), self.started)
            if sub not in ENDPOINTS:
                raise OpenAIError(
                    404,
                    f"No endpoint `/{sub}` here: POST /completions or /chat/completions, GET /models.",
                    code="unknown_url",
                )
            if request.method != "POST":
                raise OpenAIError(405, f"`/{sub}` answers POST.")
            body = await request.body()
            if len(body) > self.max_body_bytes:
                raise OpenAIError(
                    413,
                    f"The body has {len(body)} bytes; the limit is {self.max_body_bytes} "
                    "(`ServeSettings(max_body_bytes=...)`).",
                )
            try:
                payload = orjson.loads(body)
            except ValueError as exc:
                raise OpenAIError(400, f"The body is not valid JSON: {exc}") from None
            if isinstance(payload, dict):
                payload = {**payload}
            return await openai.answer(self.engine_of, sub, payload, self._choose_keyed(request), self.record)
        except OpenAIError as exc:
            return exc.response()
        except Exception as exc:  # noqa: BLE001 - the replica answers on
            import logging

            logging.getLogger("ray.serve").error("an OpenAI request failed\n%s", traceback.format_exc())
            return OpenAIError(500, f"{type(exc).__name__}: {exc}", code="server_error").response()

    async def own_generation(self, payload: Any, model: Any, label: str) -> Any:
        """raymodel's own ``{"prompt": ...}`` to a causal LM, through the model's engine (decoded together
        with the requests that arrive with it; ``"stream": true``: ``data: {"token": piece}`` events, then
        ``[DONE]``); None where the model answers it its own way (``TextGeneration.own_request``)."""
        import asyncio

        from starlette.responses import Response, StreamingResponse

        from raymodel.contract import TextRequest

        def refused(exc: Exception) -> Response:
            text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            body = {"error": "invalid payload", "detail": f"{type(exc).__name__}: {text}"}
            return Response(orjson.dumps(body), 422, media_type="application/json")

        began = time.monotonic()
        try:
            text = model.backend.text
            asked = text.own_request(model, payload) if text is not None else None
            if asked is None:
                return None
            prompts, options = asked
            stream = isinstance(payload, dict) and payload.get("stream") is True
            if stream and len(prompts) != 1:
                raise ValueError("`stream` takes one prompt (a string), not a list")
            engine = self.engine_of(model)
            ids = [engine.prompt_ids(p) for p in prompts]
        except (ValueError, TypeError, KeyError) as exc:
            return refused(exc)
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        requests = [TextRequest(row, openai.emitter(loop, out, i), **options) for i, row in enumerate(ids)]
        for r in requests:
            engine.submit(r)
        headers = {"x-raymodel-model": label}

        async def pieces() -> Any:  # (index, piece) until every request has finished
            done = 0
            try:
                while done < len(requests):
                    i, item = await out.get()
                    if isinstance(item, BaseException):
                        raise item
                    if isinstance(item, dict):
                        done += 1
                    else:
                        yield i, item
            finally:
                for r in requests:
                    r.cancelled = True

        if stream:

            async def events() -> Any:
                failed = True
                try:
                    async for _, piece in pieces():
                        yield b"data: " + orjson.dumps({"token": piece}) + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    failed = False
                except Exception as exc:  # noqa: BLE001 - the status line is sent: the error is an event
                    body = {"error": "model error", "detail": f"{type(exc).__name__}: {exc}"}
                    yield b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"
                finally:
                    self.record(label, time.monotonic() - began, failed)

            return StreamingResponse(
                events(), media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
            )
        texts = [""] * len(requests)
        failed = True
        try:
            async for i, piece in pieces():
                texts[i] += piece
            failed = False
        except Exception as exc:  # noqa: BLE001 - answered as the route's model error
            body = {"error": "model error", "detail": f"{type(exc).__name__}: {exc}"}
            return Response(orjson.dumps(body), 500, headers, media_type="application/json")
        finally:
            self.record(label, time.monotonic() - began, failed)
        content = {"text": texts[0] if len(texts) == 1 else texts}
        return Response(orjson.dumps(content), 200, headers, media_type="application/json")

    def _choose_keyed(self, request: Any) -> Any:
        from raymodel.serve._routes.traffic import KEY_HEADER

        sticky = request.headers.get(KEY_HEADER)

        async def choose(name: str, parsed: dict[str, Any]) -> tuple[str, Any, str | None]:
            parsed["key"] = sticky or parsed.get("user")
            return await self.choose(name, parsed)

        return choose
