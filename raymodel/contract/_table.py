"""The one table of backends: every place that needs to know the frameworks reads it.

A backend's model base class (``RayTorchModel``, ...) pushes itself into the
table when its class is created (``RayModel.__init_subclass__`` calls
``register``), with its ``Backend`` object, which carries the facts: name,
framework modules and packages, extra, Ray trainer, accepted data, hooks
called. Nothing here asks which plug-ins exist: the built-in ones register
because ``raymodel/backends/__init__.py`` imports them (``import raymodel``
does), and a backend defined elsewhere (a test file, a plug-in package)
registers the same way when its class is defined.

What reads the table:

* ``raymodel.__getattr__``: the lazy names ``rm.RayTorchModel``, ...;
* the docs' hook table (``hook_table``);
* ``rm.init``'s default warm pools (``jobs/_warm.py``): the backends of the model classes this
  process has defined (``defined``, ``defined_backends``).

What the table tells on registration: ``_internal.serialization`` (a
backend's framework modules are pickled by reference, never by value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from raymodel._internal import serialization
from raymodel.contract._training import Training
from raymodel.exceptions import ModelDefinitionError
from raymodel.hooks import CALLBACK_HOOK_NAMES

if TYPE_CHECKING:
    from raymodel.contract._backend import Backend

_MODELS: dict[str, type] = {}  # backend name -> its model base class
_DEFINED: dict[str, None] = {}  # the backend names of the model classes defined in this process, in order


def register(model_base: type) -> None:
    """Record ``model_base`` (a class defining ``backend``) under its backend's name; a backend that
    declares no ``training`` is a ``ModelDefinitionError`` here, where its model base class is defined."""
    backend: Backend = model_base.backend  # type: ignore[attr-defined]
    if not isinstance(getattr(type(backend), "training", None), Training):
        raise ModelDefinitionError(
            f'`{type(backend).__name__}` declares no `training`: set `training = RayTrain(loop="module:LoopClass")` '
            "on the class (or an `OwnRuns` for runs of its own; see 'Adding a backend' in the docs' backends page)."
        )
    _MODELS.setdefault(backend.name, model_base)
    serialization.pickle_by_reference(*backend.imports)


def defined(model_class: type) -> None:
    """Note a model class (a subclass of a backend's base, defined outside raymodel)."""
    backend = getattr(model_class, "backend", None)  # None: a class of no backend (a test's own)
    if backend is not None and not model_class.__module__.startswith("raymodel."):
        _DEFINED.setdefault(backend.name)


def defined_backends() -> list[str]:
    """The backend names of the model classes this process has defined so far, first defined first."""
    return list(_DEFINED)


def model_classes() -> dict[str, type]:
    """``{model base class name: class}`` of every registered backend."""
    return {cls.__name__: cls for cls in _MODELS.values()}


def backends() -> Iterator[Backend]:
    """Every registered backend (the built-in ones included)."""
    for cls in list(_MODELS.values()):
        yield cls.backend  # type: ignore[attr-defined]


def hook_table() -> str:
    """The docs' table of which hooks each built-in backend calls, from ``Backend.hook_notes``."""
    builtin = sorted(
        (b for b in backends() if type(b).__module__.startswith("raymodel.backends.")), key=lambda b: b.name
    )
    rows = ["| hook | " + " | ".join(b.name for b in builtin) + " |", "| --- |" + " --- |" * len(builtin)]
    for hook in CALLBACK_HOOK_NAMES:
        rows.append(f"| `{hook}` | " + " | ".join(b.hook_notes.get(hook, "yes") for b in builtin) + " |")
    return "\n".join(rows)
