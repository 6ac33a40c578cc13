"""The one table of backends: every place that needs to know the frameworks reads it.

A backend's model base class (``RayTorchModel``, ...) registers itself when its
class is created (``RayModel.__init_subclass__``), with its ``Backend`` object,
which carries the facts: name, framework modules and packages, extra, Ray
trainer, accepted data, hooks called. What reads the table:

* ``raymodel.__getattr__``: the lazy names ``rm.RayTorchModel``, ...;
* ``_internal.serialization``: framework modules are pickled by reference;
* ``_internal.checkpoint``: the versions recorded in checkpoints.

The built-in backends are the public modules of ``raymodel/backends/``, found
by listing the package (importing one imports no framework); a backend
defined elsewhere (a test file, a plugin) registers the same way when its
class is defined.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from raymodel.backends.base import Backend

_MODELS: dict[str, type] = {}  # backend name -> its model base class
_discovered = False


def register(model_base: type) -> None:
    """Record ``model_base`` (a class defining ``backend``) under its backend's name."""
    _MODELS.setdefault(model_base.backend.name, model_base)  # type: ignore[attr-defined]


def discover() -> None:
    """Import the built-in backend modules once, so that they register."""
    global _discovered
    if _discovered:
        return
    import raymodel.backends as package

    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_") and info.name != "base":
            importlib.import_module(f"{package.__name__}.{info.name}")
    _discovered = True


def model_classes() -> dict[str, type]:
    """``{model base class name: class}`` of every registered backend."""
    discover()
    return {cls.__name__: cls for cls in _MODELS.values()}


def backends() -> Iterator["Backend"]:
    """Every registered backend (built-in ones included)."""
    discover()
    for cls in list(_MODELS.values()):
        yield cls.backend  # type: ignore[attr-defined]


def framework_modules() -> frozenset[str]:
    """Top-level import names of every registered framework (pickled by reference)."""
    return frozenset(m.split(".")[0] for b in backends() for m in b.imports)


def hook_table() -> str:
    """The README's table of which hooks each built-in backend calls, from ``Backend.hook_notes``."""
    from raymodel.hooks import CALLBACK_HOOK_NAMES

    builtin = sorted((b for b in backends() if type(b).__module__.startswith("raymodel.backends.")),
                     key=lambda b: b.name)
    rows = ["| hook | " + " | ".join(b.name for b in builtin) + " |", "| --- |" + " --- |" * len(builtin)]
    for hook in CALLBACK_HOOK_NAMES:
        rows.append(f"| `{hook}` | " + " | ".join(b.hook_notes.get(hook, "yes") for b in builtin) + " |")
    return "\n".join(rows)
