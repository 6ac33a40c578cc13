"""Dispatch a hook to the model and the callbacks, skipping what nobody overrode."""

from __future__ import annotations

import inspect
from typing import Any, Iterable

from raymodel.exceptions import HookError
from raymodel.hooks._hooks import CALLBACK_HOOK_NAMES, is_default


async def maybe_await(value: Any) -> Any:
    """Await ``value`` if it is awaitable (an ``async def`` hook or step), else return it."""
    if inspect.isawaitable(value):
        return await value
    return value


def call_sync(fn: Any, *args: Any) -> Any:
    """Call ``fn`` outside an event loop; an ``async def`` is run to completion."""
    result = fn(*args)
    if inspect.isawaitable(result):
        import asyncio

        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


class HookRunner:
    """Calls one hook on the model, then on each callback, in order.

    Only overridden hooks are kept, so an unused hook costs one dict lookup on
    the hot path. An exception in a hook is re-raised as ``HookError``
    naming the hook and its owner, with the original as ``__cause__``.
    """

    def __init__(self, model: Any, callbacks: Iterable[Any] = (), context: Any = None) -> None:
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            cb.model = model
            cb.context = context
        self._targets: dict[str, list[Any]] = {}
        for name in CALLBACK_HOOK_NAMES:
            owners = [o for o in [model, *self.callbacks] if not is_default(o, name)]
            if owners:
                self._targets[name] = [getattr(o, name) for o in owners]

    def has(self, name: str) -> bool:
        return name in self._targets

    async def call(self, name: str, *args: Any) -> None:
        for fn in self._targets.get(name, ()):
            try:
                await maybe_await(fn(*args))
            except HookError:
                raise
            except Exception as exc:
                raise HookError(f"Hook `{_owner(fn)}.{name}` raised {type(exc).__name__}: {exc}") from exc

    async def before_batch(self, batch: Any, batch_idx: int) -> Any:
        for fn in self._targets.get("before_batch", ()):
            try:
                new = await maybe_await(fn(batch, batch_idx))
            except Exception as exc:
                raise HookError(f"Hook `{_owner(fn)}.before_batch` raised {type(exc).__name__}: {exc}") from exc
            if new is not None:
                batch = new
        return batch


def _owner(fn: Any) -> str:
    owner = getattr(fn, "__self__", None)
    return type(owner).__name__ if owner is not None else getattr(fn, "__qualname__", "?")
