"""A backend's text generation (``Backend.text``: a causal LM's), and ``TextRequest``: one generation a
serving replica asks of a model's engine: what the serving layer builds and the backend's engine runs.

A backend without it (``Backend.text`` is ``None``: every backend but transformers) carries none of its
members; ``text_generation(model)`` is how a driver asks for it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generic, TypeVar

#: The model type a backend generates with (``Model``).
M = TypeVar("M")


@dataclasses.dataclass
class TextRequest:
    """One generation: its prompt's token ids, its options, and where its pieces go.

    ``emit`` is called on the engine's thread with each piece of text as it is final, then with a
    ``dict`` of ``finish_reason`` ("stop" | "length"), ``prompt_tokens`` and ``completion_tokens``, or
    with the exception that ended it. ``cancelled`` set (the client has gone) ends it at the next step,
    unanswered. ``adapter`` names a LoRA adapter the model holds (None: its own)."""

    ids: list[int]
    emit: Callable[[Any], None]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    stop: tuple[str, ...] = ()
    seed: int | None = None
    adapter: str | None = None
    cancelled: bool = False


class TextGeneration(Generic[M]):
    """What a backend that generates text does for a serving replica: a batched engine per model, raymodel's
    own generation requests, and LoRA adapters held beside a model's weights (a route of several adapter
    versions on one base)."""

    def generates(self, model: M) -> bool:
        """Whether the (set up) model generates text (a causal LM; not every model of the backend does)."""
        return True

    def engine(self, model: M, max_batch_size: int, on_step: Any = None) -> Any:
        """The replica's batched text generation: an object with ``prompt_ids(text)``, ``chat_ids(messages)``,
        ``room(ids)`` and ``submit(request)`` (``raymodel.backends.transformers._engine``)."""
        raise NotImplementedError("The 'engine' method must be implemented.")

    def own_request(self, model: M, payload: Any) -> Any:
        """A request of raymodel's own API that the engine answers, as ``(prompts, options)`` with the
        engine's option names (``max_tokens``, ``temperature``: 0 is greedy, ``top_k``, ``top_p``), or None
        where the model's own ``preprocess``/``forward`` answer it. Raises what ``preprocess`` raises for a
        payload it refuses."""
        return None

    def attach_adapter(self, model: M, directory: Any, name: str) -> None:
        """The LoRA adapter of the checkpoint folder ``directory`` loaded beside the model's own, as ``name``."""
        raise ValueError(f"`{type(model).__name__}` holds no LoRA adapters")

    def detach_adapter(self, model: M, name: str) -> None:
        """The adapter ``attach_adapter`` loaded as ``name``, let go."""
        raise ValueError(f"`{type(model).__name__}` holds no LoRA adapters")


def text_generation(model: Any) -> TextGeneration[Any]:
    """The text generation of ``model``'s backend, for a model that generates text; a ``ValueError`` naming
    what OpenAI's API serves for any other (a backend without it, or a model of it that is no causal LM)."""
    text = model.backend.text
    if text is None or not text.generates(model):
        raise ValueError(
            f"`{type(model).__name__}` does not generate text: OpenAI's API (`ServeSettings(api='openai')`) "
            "serves a causal language model (`RayTransformersModel` with a causal LM head)"
        )
    return text
