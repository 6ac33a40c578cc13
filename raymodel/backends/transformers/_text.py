"""Text in, answers out: ``predict`` and serving of a ``RayTransformersModel``, following its task.

- a sequence classifier: ``{"text": "..." | [...]}`` -> ``{"label": [...], "score": [...]}`` (the
  config's ``id2label`` names where it has its own, else class ids; ``score`` is the softmax's top);
- a causal LM: ``{"prompt": "..." | [...], "max_new_tokens": 20, "do_sample": false, "temperature",
  "top_k", "top_p"}`` -> ``{"text": "..."}`` (a list for a list of prompts); ``stream`` gives the
  generated text in pieces as they become final, which join to exactly that text (served as
  server-sent events);
- any other head: ``{"text": ...}`` -> the model's outputs (logits, hidden states) as lists.

What is not text is a ``TypeError``/``ValueError`` naming what is expected: a 422 when served, a
``DataError`` from ``predict``; the replica keeps serving.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, Iterable, Iterator, Mapping, Sequence, Sized

import numpy as np

from raymodel.backends.transformers._data import task_of
from raymodel.contract import to_jsonable

#: Generation options a request may set: name -> (type, lowest, highest).
OPTIONS: dict[str, tuple[type, float, float]] = {
    "max_new_tokens": (int, 1, 4096),
    "temperature": (float, 1e-6, 100.0),
    "top_k": (int, 0, 100_000),
    "top_p": (float, 0.0, 1.0),
}
DEFAULT_MAX_NEW_TOKENS = 20
_DONE = object()


@dataclasses.dataclass
class Generation:
    """A causal LM's request: its prompts and generation options."""

    prompts: list[str]
    options: dict[str, Any]

    def __len__(self) -> int:
        return len(self.prompts)


def preprocess(model: Any, payload: Any) -> Any:
    if task_of(model.model) == "causal_lm":
        return generation(payload)
    return texts(payload)


def texts(payload: Any) -> list[str]:
    """The strings of ``{"text": ...}`` (or a bare string or list of strings)."""
    value = payload
    if isinstance(payload, Mapping):
        if "text" not in payload:
            raise KeyError(f'expected {{"text": "..."}} or {{"text": ["...", ...]}}; the payload has {sorted(payload)}')
        value = payload["text"]
    return _strings(value, "text")


def generation(payload: Any) -> Generation:
    """A causal LM's request: ``{"prompt": ..., "max_new_tokens": n, ...}`` checked."""
    if isinstance(payload, str):
        payload = {"prompt": payload}
    if not isinstance(payload, Mapping) or "prompt" not in payload:
        got = sorted(payload) if isinstance(payload, Mapping) else f"a {type(payload).__name__}"
        raise KeyError(f'expected {{"prompt": "...", "max_new_tokens": {DEFAULT_MAX_NEW_TOKENS}}}; got {got}')
    prompts = _strings(payload["prompt"], "prompt")
    unknown = sorted(set(payload) - {"prompt", "stream", "do_sample", *OPTIONS})
    if unknown:
        raise ValueError(f"unknown generation option(s) {unknown}; the options are {sorted(['do_sample', *OPTIONS])}")
    options: dict[str, Any] = {"max_new_tokens": DEFAULT_MAX_NEW_TOKENS, "do_sample": False}
    for name, (kind, low, high) in OPTIONS.items():
        if name in payload:
            value = payload[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
                raise TypeError(f"`{name}` must be {'an integer' if kind is int else 'a number'}; got {value!r}")
            if not low <= value <= high:
                raise ValueError(f"`{name}` must be in [{low:g}, {high:g}]; got {value!r}")
            options[name] = kind(value)
    if "do_sample" in payload:
        if not isinstance(payload["do_sample"], bool):
            raise TypeError(f"`do_sample` must be true or false; got {payload['do_sample']!r}")
        options["do_sample"] = payload["do_sample"]
    return Generation(prompts, options)


def _strings(value: Any, field: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, Sized) and isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        value = list(value)  # a column as the user holds it: a datasets Column, a pandas Series, a numpy array
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"`{field}` must be a string or a non-empty list of strings; got {_kind(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(f"`{field}[{i}]` must be a string; got {_kind(item)}")
    return list(value)


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def stack(inputs: Sequence[Any]) -> Any:
    """Requests batched along the rows: texts concatenated; generations kept apart (each its options)."""
    if all(isinstance(x, Generation) for x in inputs):
        return list(inputs)
    return [text for x in inputs for text in x]


# --------------------------------------------------------------------------- forward
def forward(model: Any, x: Any) -> Any:
    if isinstance(x, Generation) or (isinstance(x, list) and x and isinstance(x[0], Generation)):
        return [text for g in ([x] if isinstance(x, Generation) else x) for text in _generate(model, g)]
    inputs = _encode(model, list(x))
    outputs = model.model(**inputs)
    if task_of(model.model) == "classification":
        probs = outputs.logits.float().softmax(-1)
        score, label = probs.max(-1)
        return {"label": label.cpu().numpy(), "score": score.cpu().numpy()}
    return {k: v.detach().float().cpu().numpy() for k, v in outputs.items() if hasattr(v, "detach")}


def _encode(model: Any, batch: list[str]) -> dict[str, Any]:
    """The texts through the model's own ``tokenize`` (as in training), padded to one tensor batch."""
    features = dict(model.tokenize({getattr(model, "text_column", "text"): batch}))
    padded = model.tokenizer.pad(features, return_tensors="pt")
    device = model.model.device
    return {k: v.to(device) for k, v in padded.items() if k not in ("label", "labels")}


def _generate(model: Any, request: Generation, streamer: Any = None) -> list[str]:
    out = []
    for prompt in request.prompts:
        ids = model.tokenizer(prompt, return_tensors="pt")["input_ids"].to(model.model.device)
        if ids.shape[-1] == 0:
            raise ValueError(f"the prompt {prompt!r} has no tokens")
        tokenizer = model.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        generated = model.model.generate(
            ids, attention_mask=ids.new_ones(ids.shape), pad_token_id=pad, streamer=streamer, **request.options
        )
        out.append(tokenizer.decode(generated[0, ids.shape[-1] :], skip_special_tokens=True))
    return out


def postprocess(model: Any, output: Any) -> Any:
    if isinstance(output, list):  # generated texts of one request
        return {"text": output[0] if len(output) == 1 else output}
    if task_of(model.model) == "classification" and isinstance(output, dict) and "label" in output:
        names = getattr(model.model.config, "id2label", None) or {}
        own = any(str(v) != f"LABEL_{k}" for k, v in names.items())
        labels = [names.get(int(i), int(i)) if own else int(i) for i in np.asarray(output["label"]).ravel()]
        return {"label": labels, "score": [float(s) for s in np.asarray(output["score"]).ravel()]}
    return to_jsonable(output)


# --------------------------------------------------------------------------- streaming
def stream(model: Any, payload: Any) -> Iterator[str]:
    """The text of one prompt's generation in pieces, each as soon as it is final (generation runs in a
    thread); the pieces join to exactly the non-streamed answer."""
    if task_of(model.model) != "causal_lm":
        raise ValueError(f"`{type(model.model).__name__}` does not generate text; leave `stream` out of the request")
    request = generation(payload)
    if len(request.prompts) != 1:
        raise ValueError("`stream` takes one prompt (a string), not a list")
    tokens: queue.Queue[Any] = queue.Queue()

    def run() -> None:
        try:
            with model.backend.inference.mode(model):
                _generate(model, request, streamer=_streamer(model.tokenizer, tokens))
        except BaseException as exc:  # noqa: BLE001 - handed to the reading side
            tokens.put(exc)
        finally:
            tokens.put(_DONE)

    threading.Thread(target=run, name="raymodel-generate", daemon=True).start()
    return _drain(tokens)


def _drain(tokens: queue.Queue[Any]) -> Iterator[str]:
    while True:
        item = tokens.get()
        if item is _DONE:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def _streamer(tokenizer: Any, pieces: queue.Queue[Any]) -> Any:
    """transformers' own incremental detokenization (``TextStreamer``): the new tokens are decoded
    together as they come and a piece is handed on once it can no longer change (a byte-level BPE
    character split over tokens, a WordPiece ``##`` piece), so the pieces join to exactly the text
    ``tokenizer.decode`` gives for the whole generation. The prompt is skipped."""
    from transformers import TextStreamer

    class _Pieces(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if text:
                pieces.put(text)

    return _Pieces(tokenizer, skip_prompt=True, skip_special_tokens=True)
