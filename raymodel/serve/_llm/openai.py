"""OpenAI's API on a route of a causal LM (``ServeSettings(api="openai")``): ``POST {route}/completions``,
``POST {route}/chat/completions``, ``GET {route}/models``.

Requests are checked field by field (OpenAI's fields that mean something here; ``n`` other than 1 and
any other field are refused, naming it), answered with OpenAI's objects (``text_completion``,
``chat.completion``; streamed as server-sent ``data:`` chunks, ``text_completion`` and
``chat.completion.chunk`` as OpenAI sends them, then ``data: [DONE]``), and errors are OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` with its status codes. The generation itself is the
replica's ``Engine`` (one per model held), which decodes the requests that arrive together in one batch.

The server classes hand a request's ``model`` to their own ``choose`` (which version or adapter answers)
and list their ids with ``model_ids``; everything else is here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson
from starlette.responses import Response, StreamingResponse

from raymodel.contract import TextRequest
from raymodel.serve._replica import auth

#: Fields each endpoint takes (``user`` names the caller: the sticky key of a split route).
COMMON = {"model", "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "stream_options", "n", "user"}
FIELDS = {"completions": COMMON | {"prompt"}, "chat/completions": COMMON | {"messages", "max_completion_tokens"}}
#: OpenAI's default ``max_tokens`` of a completion (a chat answer runs to the end of the context).
COMPLETION_MAX_TOKENS = 16


class OpenAIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> Response:
        kind = {401: "invalid_request_error", 404: "invalid_request_error"}.get(self.status)
        kind = kind or ("server_error" if self.status >= 500 else "invalid_request_error")
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        headers = auth.CHALLENGE if self.status == 401 else None
        return Response(orjson.dumps(body), self.status, headers, media_type="application/json")


def unauthorized() -> Response:
    return OpenAIError(401, auth.MISSING, code="invalid_api_key").response()


def _bad(message: str, param: str | None) -> OpenAIError:
    return OpenAIError(400, message, param)


# --------------------------------------------------------------------------- requests
def parse(endpoint: str, body: Any) -> dict[str, Any]:
    """The request's options, checked; an ``OpenAIError`` (400) naming the first field that is wrong."""
    if not isinstance(body, dict):
        raise _bad("The body must be a JSON object.", None)
    unknown = sorted(set(body) - FIELDS[endpoint])
    if unknown:
        raise _bad(
            f"Unrecognized request argument(s) {unknown}; /{endpoint} takes {sorted(FIELDS[endpoint])}.", unknown[0]
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("You must provide a model parameter (GET /models lists them).", "model")
    if body.get("n", 1) not in (1, None):
        raise _bad(f"`n` must be 1 here (got {body['n']!r}): send one request per answer.", "n")
    request: dict[str, Any] = {"model": model, "user": _optional(body, "user", str, "a string")}
    if endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt or not all(isinstance(p, str) and p for p in prompt):
            raise _bad("`prompt` must be a non-empty string or a list of them (token ids are not taken).", "prompt")
        request["prompts"] = prompt
    else:
        request["messages"] = _messages(body.get("messages"))
    chat_limit = body.get("max_completion_tokens") if body.get("max_tokens") is None else body.get("max_tokens")
    limit = body.get("max_tokens") if endpoint == "completions" else chat_limit
    param = "max_tokens" if endpoint == "completions" or body.get("max_tokens") is not None else "max_completion_tokens"
    if limit is None:
        limit = COMPLETION_MAX_TOKENS if endpoint == "completions" else None
    elif isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise _bad(f"`{param}` must be an integer >= 1 (got {limit!r}).", param)
    request["max_tokens"] = limit
    request["temperature"] = _number(body, "temperature", 1.0, 0.0, 2.0)
    request["top_p"] = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise _bad("`stop` must be a non-empty string or a list of up to 4 of them.", "stop")
    request["stop"] = tuple(stop)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad(f"`seed` must be an integer (got {seed!r}).", "seed")
    request["seed"] = seed
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise _bad(f"`stream` must be true or false (got {stream!r}).", "stream")
    request["stream"] = bool(stream)
    options = body.get("stream_options")
    if options is not None:
        if not request["stream"]:
            raise _bad("`stream_options` is only allowed when `stream` is true.", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _bad('`stream_options` takes {"include_usage": true | false}.', "stream_options")
        request["include_usage"] = bool(options.get("include_usage"))
    return request


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise _bad("`messages` must be a non-empty list of {role, content} objects.", "messages")
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # OpenAI's content parts: text only here
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise _bad(f"`messages[{i}].content`: only text parts are taken.", f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise _bad(f"`messages[{i}]` must be an object with a `role` and a text `content`.", f"messages[{i}]")
        out.append({"role": m["role"], "content": content})
    return out


def _optional(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise _bad(f"`{name}` must be {what} (got {value!r}).", name)
    return value


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (low < value <= high if low_open else low <= value <= high)
    ):
        raise _bad(f"`{name}` must be a number in {'(' if low_open else '['}{low:g}, {high:g}] (got {value!r}).", name)
    return float(value)


# --------------------------------------------------------------------------- answers
Choose = Callable[[str, dict[str, Any]], Awaitable[tuple[str, Any, str | None]]]


async def answer(
    engine_of: Callable[[Any], Any],
    endpoint: str,
    body: Any,
    choose: Choose,
    record: Callable[[str, float, bool], None],
) -> Response:
    """One request to ``/completions`` or ``/chat/completions``: checked, its model chosen
    (``choose(model, request) -> (id, model, adapter)``, an ``OpenAIError`` 404 for a model the route
    does not serve), generated, answered whole or streamed."""
    began = time.monotonic()
    request = parse(endpoint, body)
    label, model, adapter = await choose(request["model"], request)
    try:
        engine = engine_of(model)
        if endpoint == "completions":
            prompts = [engine.prompt_ids(p) for p in request["prompts"]]
        else:
            prompts = [engine.chat_ids(request["messages"])]
    except ValueError as exc:
        record(label, time.monotonic() - began, False)  # the client's error: the version is let go
        raise _bad(str(exc), "prompt" if endpoint == "completions" else "messages") from None
    except BaseException:
        record(label, time.monotonic() - began, True)
        raise
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    generations = []
    for i, ids in enumerate(prompts):
        generations.append(_submit(engine, ids, request, adapter, emitter(loop, queue, i)))
    chat = endpoint == "chat/completions"
    head = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
        "created": int(time.time()),
        "model": label,
    }
    if request["stream"]:
        return StreamingResponse(
            _events(queue, generations, head, chat, request.get("include_usage", False), label, began, record),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "x-raymodel-model": label},
        )
    texts = [""] * len(prompts)
    finishes: list[Any] = [None] * len(prompts)
    failed = True
    try:
        while any(f is None for f in finishes):
            i, item = await queue.get()
            if isinstance(item, BaseException):
                raise OpenAIError(500, f"The model failed: {type(item).__name__}: {item}", code="model_error")
            if isinstance(item, dict):
                finishes[i] = item
            else:
                texts[i] += item
        failed = False
    finally:
        for g in generations:
            g.cancelled = True
        record(label, time.monotonic() - began, failed)
    usage = _usage(finishes)
    if chat:
        choices = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": texts[0]},
                "logprobs": None,
                "finish_reason": finishes[0]["finish_reason"],
            }
        ]
        content = {**head, "object": "chat.completion", "choices": choices, "usage": usage}
    else:
        choices = [
            {"index": i, "text": t, "logprobs": None, "finish_reason": f["finish_reason"]}
            for i, (t, f) in enumerate(zip(texts, finishes))
        ]
        content = {**head, "object": "text_completion", "choices": choices, "usage": usage}
    return Response(orjson.dumps(content), 200, {"x-raymodel-model": label}, media_type="application/json")


def emitter(
    loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[int, Any]], index: int
) -> Callable[[Any], None]:
    """What a generation's ``emit`` is: its items onto ``queue`` (on the event loop), tagged ``index``."""

    def emit(item: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (index, item))

    return emit


def _submit(engine: Any, ids: list[int], request: dict[str, Any], adapter: str | None, emit: Any) -> Any:
    limit = request["max_tokens"]
    room = engine.room(ids)
    generation = TextRequest(
        ids,
        emit,
        max_tokens=limit if limit is not None else (room or 256),
        temperature=request["temperature"],
        top_p=request["top_p"],
        stop=request["stop"],
        seed=request["seed"],
        adapter=adapter,
    )
    engine.submit(generation)
    return generation


def _usage(finishes: list[dict[str, Any]]) -> dict[str, int]:
    prompt = sum(f["prompt_tokens"] for f in finishes)
    completion = sum(f["completion_tokens"] for f in finishes)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _events(
    queue: asyncio.Queue[tuple[int, Any]],
    generations: list[Any],
    head: dict[str, Any],
    chat: bool,
    include_usage: bool,
    label: str,
    began: float,
    record: Callable[[str, float, bool], None],
) -> AsyncIterator[bytes]:
    """OpenAI's server-sent chunks: (chat: the assistant's role first) each piece as it is final, each
    choice's finish, the usage where asked, ``[DONE]``."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    extra = {"usage": None} if include_usage else {}

    def chunk(i: int, piece: str | None, finish: str | None, first: bool = False) -> bytes:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if piece is not None:
                delta["content"] = piece
            choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": i, "text": piece or "", "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**head, "object": kind, "choices": [choice], **extra}) + b"\n\n"

    finishes: list[Any] = [None] * len(generations)
    failed = True
    try:
        if chat:
            yield chunk(0, None, None, first=True)
        while any(f is None for f in finishes):
            i, item = await queue.get()
            if isinstance(item, BaseException):
                error = {
                    "message": f"The model failed: {type(item).__name__}: {item}",
                    "type": "server_error",
                    "param": None,
                    "code": "model_error",
                }
                yield b"data: " + orjson.dumps({"error": error}) + b"\n\n"
                return
            if isinstance(item, dict):
                finishes[i] = item
                yield chunk(i, None if chat else "", item["finish_reason"])
            else:
                yield chunk(i, item, None)
        if include_usage:
            yield b"data: " + orjson.dumps({**head, "object": kind, "choices": [], "usage": _usage(finishes)}) + b"\n\n"
        yield b"data: [DONE]\n\n"
        failed = False
    finally:  # the client may have gone: its generations stop at the next step
        for g in generations:
            g.cancelled = True
        record(label, time.monotonic() - began, failed)


def models(ids: list[str], created: float) -> Response:
    data = [{"id": i, "object": "model", "created": int(created), "owned_by": "raymodel"} for i in ids]
    return Response(orjson.dumps({"object": "list", "data": data}), 200, media_type="application/json")


def not_found(model: str, ids: list[str]) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{model}` does not exist on this route; it serves {', '.join(ids) or 'nothing yet'}.",
        "model",
        "model_not_found",
    )
