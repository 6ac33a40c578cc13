"""``TextRequest``: one generation a serving replica asks of a model's text engine
(``Backend.text_engine``): what the serving layer builds and the engine of a backend runs."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


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
