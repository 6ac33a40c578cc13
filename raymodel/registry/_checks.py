"""Checks every registry operation shares: its ``OSError``s as ``RegistryError``s, and JSON-only notes."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

from raymodel.exceptions import RayModelError, RegistryError

F = TypeVar("F", bound=Callable[..., Any])


def os_errors(method: F) -> F:
    """A registry operation's ``OSError`` (a read-only registry, a file where a key's folder belongs, a
    full disk) as a ``RegistryError`` naming the registry, the path and what to do."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            if isinstance(exc, RayModelError):
                raise
            where = f"`{exc.filename}`" if exc.filename else "a file"
            hint = {
                PermissionError: " Open a registry this user may write (`rm.registry.open(...)`, "
                "`RAYMODEL_REGISTRY`), or give it write access.",
                NotADirectoryError: " Something that is not a folder stands where the registry keeps one; "
                "move it out of the registry.",
                FileExistsError: " A file stands where the registry keeps a folder; move it out of the registry.",
            }.get(type(exc), "")
            raise RegistryError(
                f"`{method.__name__}` failed in the registry `{self.uri}` on {where}: "
                f"{exc.strerror or exc}.{hint} Nothing was changed."
            ) from exc

    return wrapper  # type: ignore[return-value]


def check_json(name: str, value: Any) -> None:
    """``metadata`` and ``lineage``: a dict of JSON values (no NaN, no objects that would be kept as
    their repr); a ``RegistryError`` naming the first key that is not."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise RegistryError(
            f"`{name}` must be a dict of JSON values, e.g. `{{'note': 'baseline'}}` (got {value!r} that is a "
            f"{type(value).__name__})."
        )
    problem = _json_problem(value, name)
    if problem:
        raise RegistryError(f"`{name}` must hold JSON values only (strings, finite numbers, lists, dicts): {problem}.")


def _json_problem(value: Any, where: str) -> str | None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{where} has the key {k!r} that is a {type(k).__name__}, not a string"
            found = _json_problem(v, f"{where}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        return next((p for i, v in enumerate(value) if (p := _json_problem(v, f"{where}[{i}]"))), None)
    if isinstance(value, np.generic):  # a numpy scalar counts as its Python value (np.float32(0.9) is fine)
        return _json_problem(value.item(), where) if value.dtype.kind in "biuf" else _kept_as_repr(value, where)
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value!r}, which JSON cannot hold"
    if value is None or isinstance(value, (str, bool, int, float)):
        return None
    return _kept_as_repr(value, where)


def _kept_as_repr(value: Any, where: str) -> str:
    return f"{where} is a {type(value).__name__} ({value!r:.60}), which would be kept only as its repr"
