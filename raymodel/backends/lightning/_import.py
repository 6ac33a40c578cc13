"""Lightning's import: ``lightning.pytorch`` where the unified package is installed, else
``pytorch_lightning`` (the ``lightning`` extra), or ``MissingDependencyError`` naming the extra."""

from __future__ import annotations

from typing import Any

from raymodel._internal.deps import require


def lightning() -> Any:
    """The Lightning module (``pl``), imported on first use."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = require("pytorch_lightning", "lightning")
    return pl
