"""Import an optional framework, or fail with the extra that installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from raymodel.exceptions import MissingDependencyError


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ``MissingDependencyError`` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"`{module}` is not installed, and this backend needs it. "
            f"Install it with `pip install 'raymodel[{extra}]'`."
        ) from exc
