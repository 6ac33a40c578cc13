"""Pickle a model class by value, so it loads where its module does not exist.

cloudpickle already pickles classes from ``__main__`` by value. A class from an
importable module (a test file, a user's package on the driver only) would be
pickled by reference and fail to import on a worker or in another process; we
register its module for by-value pickling while we dump. raymodel itself, Ray,
numpy and every registered backend's framework modules are always pickled by
reference: the backend table (``raymodel/contract/_table.py``) hands them to
``pickle_by_reference`` when a backend registers.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import cloudpickle

_BY_REFERENCE: set[str] = {"raymodel", "ray", "numpy", "cloudpickle", "builtins"}


def pickle_by_reference(*modules: str) -> None:
    """Always pickle the top-level packages of ``modules`` (``"torch.nn"`` -> ``torch``) by reference."""
    _BY_REFERENCE.update(m.split(".")[0] for m in modules)


def _by_reference_roots() -> frozenset[str]:
    return frozenset(_BY_REFERENCE)


@contextlib.contextmanager
def by_value(*objects: Any) -> Iterator[None]:
    """Within the block, cloudpickle the user modules defining ``objects`` by value."""
    registered: list[str] = []
    by_reference = _by_reference_roots()
    for obj in objects:
        cls = obj if isinstance(obj, type) else type(obj)
        for klass in cls.__mro__:
            name = klass.__module__
            module = sys.modules.get(name)
            if module is None or name == "__main__" or name.split(".")[0] in by_reference or name in registered:
                continue
            try:
                cloudpickle.register_pickle_by_value(module)
            except ValueError:  # already registered
                continue
            registered.append(name)
    try:
        yield
    finally:
        for name in registered:
            module = sys.modules.get(name)
            if module is not None:
                with contextlib.suppress(ValueError):
                    cloudpickle.unregister_pickle_by_value(module)


def dumps(obj: Any, *by_value_of: Any) -> bytes:
    """``cloudpickle.dumps`` with the user classes of ``by_value_of`` pickled by value."""
    with by_value(*by_value_of):
        return cloudpickle.dumps(obj)


def loads(data: bytes) -> Any:
    return cloudpickle.loads(data)
