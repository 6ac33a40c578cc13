"""The default ``tokenize`` of a causal LM's data as LLM users hold it: ``prompt``/``completion`` columns,
and chat ``messages`` columns (``[{"role": ..., "content": ...}, ...]``) rendered with the tokenizer's
chat template. For both, the loss counts the answer's tokens only: every other token's label is
``-100`` (the prompt; the system's and user's turns), as TRL's completion-only training does.

Tokens are matched to characters by the fast tokenizer's offsets, so a byte-level BPE token that
straddles the prompt's end counts as the answer's (it holds some of it). A completion ends with the
tokenizer's end-of-sequence token (labelled: the model learns to stop); a chat's turns end as its
template ends them. Rows are truncated to ``max_length``: the config key, else the model's positions.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from raymodel.exceptions import DataError

#: The label of a token the loss does not count (the ``Trainer``'s and torch's ``ignore_index``).
IGNORE = -100


def tokenize(model: Any, batch: Mapping[str, list[Any]]) -> dict[str, list[list[int]]]:
    """``input_ids``, ``attention_mask`` and completion-only ``labels`` of a ``prompt``/``completion`` or
    ``messages`` batch; ``DataError`` naming the columns otherwise."""
    columns = sorted(batch)
    tokenizer = model.tokenizer
    if "messages" in batch:
        _fast(tokenizer, "`messages`")
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"The data has a `messages` column, but `{type(model).__name__}`'s tokenizer has no chat template: "
                "set `self.tokenizer.chat_template` in `setup` (a Jinja template), or pass `prompt`/`completion` "
                "columns instead."
            )
        rows = [_chat_row(tokenizer, _messages(m), limit(model)) for m in batch["messages"]]
    elif "prompt" in batch or "completion" in batch:
        if "completion" not in batch or "prompt" not in batch:
            missing = "completion" if "completion" not in batch else "prompt"
            raise DataError(
                f"The data has a `{'prompt' if missing == 'completion' else 'completion'}` column but no "
                f"`{missing}` column (columns: {columns}); prompt/completion data needs both."
            )
        _fast(tokenizer, "`prompt`/`completion`")
        rows = [
            _pair_row(tokenizer, _text(p, "prompt"), _text(c, "completion"), limit(model))
            for p, c in zip(batch["prompt"], batch["completion"])
        ]
    else:
        raise DataError(
            f"`{type(model).__name__}` tokenizes a `{model.text_column}` column, `prompt` and `completion` columns, "
            f"or a chat `messages` column; the data has {columns}. Rename a column, or define `tokenize(batch)`."
        )
    for ids, labels in rows:
        if all(label == IGNORE for label in labels):
            raise DataError(
                f"A row's answer is cut off: its prompt fills the {len(ids)} tokens it is truncated to, so nothing "
                f"in it would be learned. Raise the `max_length` config key (the model's positions bound it) or "
                f"shorten the prompt: {tokenizer.decode(ids[:24])!r:.80}…"
            )
    return {
        "input_ids": [ids for ids, _ in rows],
        "attention_mask": [[1] * len(ids) for ids, _ in rows],
        "labels": [labels for _, labels in rows],
    }


def limit(model: Any) -> int:
    """The longest row: the config's ``max_length``, else the model's positions, else the class's."""
    if model.config.get("max_length") is not None:
        return int(model.config["max_length"])
    hf_config = getattr(model.model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(hf_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return int(model.max_length)


def _pair_row(tokenizer: Any, prompt: str, completion: str, most: int) -> tuple[list[int], list[int]]:
    encoded = tokenizer(prompt + completion, return_offsets_mapping=True, verbose=False)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    labels = [token if end > len(prompt) else IGNORE for token, (_, end) in zip(ids, offsets)]
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
        labels.append(tokenizer.eos_token_id)
    return ids[:most], labels[:most]


def _chat_row(tokenizer: Any, messages: list[dict[str, str]], most: int) -> tuple[list[int], list[int]]:
    text = _render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        asked = _render(tokenizer, messages[:i], generation_prompt=True) if i else ""
        end_text = _render(tokenizer, messages[: i + 1])
        if not (text.startswith(end_text) and end_text.startswith(asked)):
            raise DataError(
                "The tokenizer's chat template does not render a conversation's turns as prefixes of the whole "
                "(the answer's tokens cannot be found in it); pass `prompt`/`completion` columns, or define "
                "`tokenize(batch)`."
            )
        spans.append((len(asked), len(end_text)))
    if not spans:
        raise DataError(
            "A conversation of the `messages` column has no `assistant` turn: nothing in it would be learned."
        )
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False, verbose=False)
    ids = list(encoded["input_ids"])
    labels = [
        token if any(s < end and begin < e for s, e in spans) else IGNORE
        for token, (begin, end) in zip(ids, encoded["offset_mapping"])
    ]
    return ids[:most], labels[:most]


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt))


def _messages(value: Any) -> list[dict[str, str]]:
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        out = []
        for m in value:
            if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                break
            out.append({"role": m["role"], "content": m["content"]})
        else:
            return out
    raise DataError(
        f"A row of the `messages` column is {value!r:.120}; each is a list of "
        '`{"role": "user" | "assistant" | "system", "content": "..."}` turns.'
    )


def _text(value: Any, column: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"A row of the `{column}` column is a {type(value).__name__}; each is text.")
    return value


def _fast(tokenizer: Any, what: str) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"raymodel tokenizes {what} data with a fast tokenizer (its offsets find the answer's tokens); "
            f"`{type(tokenizer).__name__}` is not one. Use `PreTrainedTokenizerFast`, or define `tokenize(batch)`."
        )
