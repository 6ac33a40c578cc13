"""When things happen: the hook list, the ``Callback`` base, and the dispatcher."""

from raymodel.hooks._context import RunContext
from raymodel.hooks._dispatch import HookRunner, call_sync, maybe_await
from raymodel.hooks._hooks import (
    CALLBACK_HOOK_NAMES,
    HOOK_NAMES,
    Callback,
    ModelHooks,
    TrainingHooks,
    default,
    is_default,
)

__all__ = [
    "HOOK_NAMES",
    "CALLBACK_HOOK_NAMES",
    "Callback",
    "RunContext",
    "ModelHooks",
    "TrainingHooks",
    "HookRunner",
    "default",
    "is_default",
    "maybe_await",
    "call_sync",
]
