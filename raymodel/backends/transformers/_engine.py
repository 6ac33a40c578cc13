"""A serving replica's text generation: requests decoded together, one forward per step for the batch.

``Engine`` runs on a thread of its own. Requests that arrive together are prefilled together (left
padded, masked, each row's positions counted from its first real token); then each step feeds every
running sequence its last token and samples the next from its own row (greedy at temperature 0,
else temperature and top-p with the request's own seeded generator). A request that arrives while
others generate joins at the next step (continuous batching): it is prefilled alone and its key/value
cache is left-padded to the batch's and stacked onto it. That needs the model's cache to be plain
``DynamicLayer`` tensors (GPT-2's, Llama's); a model whose cache is not (a sliding window, a static
cache) takes new requests when the running batch has finished instead. A finished sequence leaves the
batch at once (its cache rows are dropped), so the batch is always the requests still generating.

Each sequence's text is decoded incrementally by transformers' ``TextStreamer`` (a piece is handed on
once it can no longer change), and a piece that could be the start of a ``stop`` string is held back
until it is known not to be; so the pieces a request is sent join to exactly its whole answer, which
ends before its first stop string. A request's LoRA adapter (a peft model serving several) is chosen
per row: peft's mixed-adapter batches (``adapter_names``).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from raymodel.contract import TextRequest as Request

logger = logging.getLogger("ray.serve")

#: peft's name for "no adapter" in a mixed batch.
BASE = "__base__"


class Engine:
    """Continuous batching of one causal LM (see the module's docstring)."""

    def __init__(self, model: Any, max_batch_size: int = 16, on_step: Callable[[int], None] | None = None) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.on_step = on_step or (lambda size: None)
        self.context = context_of(model.model)
        config = getattr(model.model, "generation_config", None) or model.model.config
        eos = getattr(config, "eos_token_id", None)
        if eos is None:
            eos = model.tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        pad = model.tokenizer.pad_token_id
        self.pad = pad if pad is not None else (min(self.eos) if self.eos else 0)
        self.joins = True  # whether a request may join a running batch (False once a cache is not plain)
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------- requests
    def prompt_ids(self, prompt: str) -> list[int]:
        ids = list(self.model.tokenizer(prompt)["input_ids"])
        return self._checked(ids, f"the prompt {prompt[:40]!r}")

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The tokenizer's chat template over ``messages``, with the assistant's turn opened."""
        tokenizer = self.model.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"`{type(self.model).__name__}`'s tokenizer has no chat template: send `prompt` to "
                "/completions, or set `tokenizer.chat_template` in `setup`"
            )
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._checked(ids, "the messages")

    def _checked(self, ids: list[int], what: str) -> list[int]:
        if not ids:
            raise ValueError(f"{what} has no tokens")
        if self.context is not None and len(ids) >= self.context:
            raise ValueError(
                f"{what} has {len(ids)} tokens; the model's context is {self.context} tokens, the answer included"
            )
        return ids

    def room(self, ids: list[int]) -> int | None:
        """The most tokens a generation after ``ids`` can have (the model's context), or None."""
        return None if self.context is None else self.context - len(ids)

    def submit(self, request: Request) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="raymodel-generate", daemon=True)
                self._thread.start()
        self._queue.put(request)

    def close(self) -> None:
        """End the engine's thread once the requests it has are answered (its model is let go)."""
        self._queue.put(None)

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on the engine's thread between two steps (a change of the model, such as an
        adapter loaded or let go, never lands in the middle of a forward)."""
        future: Future[Any] = Future()
        self.submit(_Call(fn, future))  # type: ignore[arg-type]
        return future

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        waiting: collections.deque[Any] = collections.deque()
        batch = _Batch(self)
        closing = False

        def take(item: Any) -> None:
            nonlocal closing
            if item is None:
                closing = True
            elif isinstance(item, _Call):
                item.run()
            else:
                waiting.append(item)

        while True:
            if not batch.seqs and not waiting:
                if closing:
                    return
                take(self._queue.get())
                continue
            while True:
                try:
                    take(self._queue.get_nowait())
                except queue.Empty:
                    break
            room = self.max_batch_size - len(batch.seqs)
            if waiting and room > 0 and (not batch.seqs or self.joins):
                new = [waiting.popleft() for _ in range(min(room, len(waiting)))]
                try:
                    batch.admit(new)
                except Exception as exc:
                    logger.exception("prefilling %d request(s) failed", len(new))
                    for request in new:
                        request.emit(exc)
            if not batch.seqs:
                continue
            try:
                batch.step()
            except Exception as exc:
                logger.exception("a generation step of %d request(s) failed", len(batch.seqs))
                for seq in batch.seqs:
                    seq.request.emit(exc)
                batch = _Batch(self)


class _Call:
    def __init__(self, fn: Callable[[], Any], future: Future[Any]) -> None:
        self.fn, self.future = fn, future

    def run(self) -> None:
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.future.set_exception(exc)


class _Batch:
    """The running sequences, their key/value cache and attention mask, and the logits of their next token."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seqs: list[_Sequence] = []
        self.cache: Any = None
        self.mask: Any = None
        self.logits: Any = None

    def _forward(self, ids: Any, mask: Any, positions: Any, cache: Any, seqs: list[_Sequence]) -> Any:
        kwargs: dict[str, Any] = {}
        hf = self.engine.model.model
        if hasattr(hf, "peft_config"):  # a request without an adapter takes the model's active one
            active = hf.active_adapter
            names = [s.request.adapter or active for s in seqs]
            if any(name != active for name in names):
                kwargs["adapter_names"] = names
        with self.engine.model.backend.inference.mode(self.engine.model):  # eval mode (no dropout), no gradients
            out = hf(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                **kwargs,
            )
        return out.past_key_values, out.logits[:, -1, :].float()

    def admit(self, requests: list[Request]) -> None:
        """Prefill ``requests`` together (left padded) and stack them onto the running batch."""
        import torch

        device = self.engine.model.model.device
        width = max(len(r.ids) for r in requests)
        ids = torch.full((len(requests), width), self.engine.pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(requests), width), dtype=torch.long, device=device)
        for i, r in enumerate(requests):
            ids[i, width - len(r.ids) :] = torch.tensor(r.ids, device=device)
            mask[i, width - len(r.ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        seqs = [_Sequence(self.engine, r) for r in requests]
        cache, logits = self._forward(ids, mask, positions, None, seqs)
        if not self.seqs:
            self.cache, self.mask, self.logits, self.seqs = cache, mask, logits, seqs
            self.engine.joins = self.engine.joins and _plain(cache)
            return
        self.cache, self.mask = _stacked(self.cache, self.mask, cache, mask)
        self.logits = torch.cat([self.logits, logits])
        self.seqs += seqs

    def step(self) -> None:
        """One token for every running sequence; the finished leave; one forward for the rest."""
        import torch

        greedy = self.logits.argmax(-1).tolist()
        for i, seq in enumerate(self.seqs):
            if seq.request.cancelled:  # its client has gone
                seq.finished = True
            else:
                seq.take(greedy[i] if seq.greedy else seq.sample(self.logits[i]))
        keep = [i for i, s in enumerate(self.seqs) if not s.finished]
        if not keep:
            self.seqs, self.cache, self.mask, self.logits = [], None, None, None
            return
        if len(keep) < len(self.seqs):
            index = torch.tensor(keep, device=self.mask.device)
            self.seqs = [self.seqs[i] for i in keep]
            self.cache.batch_select_indices(index)
            self.mask = self.mask[index]
            self._trim()
        last = torch.tensor([[s.last] for s in self.seqs], dtype=torch.long, device=self.mask.device)
        positions = self.mask.sum(-1, keepdim=True)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.seqs), 1))], dim=-1)
        self.cache, self.logits = self._forward(last, self.mask, positions, self.cache, self.seqs)
        self.engine.on_step(len(self.seqs))

    def _trim(self) -> None:
        """Drop the cache's leading columns that no remaining sequence attends to (finished ones' padding)."""
        if not _plain(self.cache):
            return
        unused = int((self.mask.sum(0) == 0).long().cumprod(0).sum())
        if unused:
            self.mask = self.mask[:, unused:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, unused:], layer.values[:, :, unused:]


def _plain(cache: Any) -> bool:
    """Whether every layer of ``cache`` is a plain ``DynamicLayer`` (tensors that can be padded and stacked)."""
    from transformers.cache_utils import DynamicLayer

    layers: Any = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


def _stacked(cache: Any, mask: Any, new_cache: Any, new_mask: Any) -> tuple[Any, Any]:
    """Two batches' caches and masks as one: the shorter left-padded (masked out), then stacked."""
    import torch
    import torch.nn.functional as F

    width = max(mask.shape[1], new_mask.shape[1])

    def pad(t: Any, to: int) -> Any:  # [batch, heads, seq, dim] on the seq axis, or a mask [batch, seq]
        missing = to - t.shape[-2 if t.dim() == 4 else -1]
        if not missing:
            return t
        return F.pad(t, (0, 0, missing, 0)) if t.dim() == 4 else F.pad(t, (missing, 0))

    for old, new in zip(cache.layers, new_cache.layers):
        old.keys = torch.cat([pad(old.keys, width), pad(new.keys, width)])
        old.values = torch.cat([pad(old.values, width), pad(new.values, width)])
    return cache, torch.cat([pad(mask, width), pad(new_mask, width)])


class _Sequence:
    """A request while it generates: its tokens, its text so far, what it has been sent."""

    def __init__(self, engine: Engine, request: Request) -> None:
        self.engine, self.request = engine, request
        self.greedy = request.temperature <= 1e-5
        self.generator = None
        if not self.greedy:
            import torch

            self.generator = torch.Generator(device=engine.model.model.device)
            if request.seed is not None:
                self.generator.manual_seed(request.seed)
            else:
                self.generator.seed()
        self.last = request.ids[-1]
        self.generated = 0
        self.text = ""  # the finalized text (the streamer's pieces)
        self.sent = 0  # how much of ``text`` has been emitted
        self.finished = False
        self.streamer = _streamer(engine.model.tokenizer, self)
        room = engine.room(request.ids)
        self.limit = request.max_tokens if room is None else min(request.max_tokens, room)

    def sample(self, logits: Any) -> int:
        import torch

        if 0 < self.request.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.request.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits / self.request.temperature, dim=-1)
        if self.request.top_p < 1.0:
            ordered, order = probs.sort(descending=True)
            outside = ordered.cumsum(-1) - ordered > self.request.top_p  # the nucleus keeps its first token
            probs = torch.zeros_like(probs).scatter(0, order, ordered.masked_fill(outside, 0.0))
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def take(self, token: int) -> None:
        import torch

        self.generated += 1
        if token in self.engine.eos:
            self._finish("stop")
            return
        self.last = token
        self.streamer.put(torch.tensor([token]))
        if self.finished:  # a stop string
            return
        if self.generated >= self.limit:
            self._finish("length")

    def finalized(self, piece: str) -> None:
        """The streamer's next final piece: sent on, less what could begin a stop string."""
        if self.finished:
            return
        self.text += piece
        stops = self.request.stop
        found = [i for i in (self.text.find(s) for s in stops) if i >= 0]
        if found:
            self.text = self.text[: min(found)]
            self._send(len(self.text))
            self._done("stop")
            return
        held = max((k for s in stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        self._send(len(self.text) - held)

    def _send(self, upto: int) -> None:
        if upto > self.sent:
            self.request.emit(self.text[self.sent : upto])
            self.sent = upto

    def _finish(self, reason: str) -> None:
        self.streamer.end()  # the rest of the text, final now (it may still hold a stop string)
        if not self.finished:
            self._send(len(self.text))
            self._done(reason)

    def _done(self, reason: str) -> None:
        self.finished = True
        self.request.emit(
            {"finish_reason": reason, "prompt_tokens": len(self.request.ids), "completion_tokens": self.generated}
        )


def _streamer(tokenizer: Any, seq: _Sequence) -> Any:
    from transformers import TextStreamer

    class _Pieces(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if text:
                seq.finalized(text)

    return _Pieces(tokenizer, skip_prompt=False, skip_special_tokens=True)


def context_of(hf_model: Any) -> int | None:
    """The most positions the model takes (GPT-2's ``n_positions``, Llama's ``max_position_embeddings``)."""
    config = hf_model.config
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
