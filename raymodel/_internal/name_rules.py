"""The one place that says what a name may be: registry keys, aliases, versions, run names.

Every one of them becomes a folder or file name, so each is a single, plain
path component: ASCII letters, digits, ``_``, ``-`` and ``.``, not starting
with ``.`` or ``-``, at most 128 characters. Nothing that passes can reach
outside the folder it is joined to (no ``/``, no ``..``, no NUL, no drive).
"""

from __future__ import annotations

import re
from typing import Any

from raymodel.exceptions import RegistryError

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
#: The largest version number (versions are plain positive ints).
MAX_VERSION = 2**31 - 1


def name_problem(value: Any, what: str) -> str | None:
    """Why ``value`` is not a safe name (a problem string for a settings error), or None."""
    if isinstance(value, str) and _NAME.fullmatch(value):
        return None
    return (
        f"{what} must be 1 to 128 characters of letters, digits, '_', '-' and '.', not starting "
        f"with '.' or '-' (got {value!r})."
    )


def key(value: Any) -> str:
    """A registry key, or ``RegistryError``."""
    problem = name_problem(value, "A registry key")
    if problem:
        raise RegistryError(problem)
    return value


def alias(value: Any) -> str:
    """A registry alias (a name that is not a number), or ``RegistryError``."""
    problem = name_problem(value, "An alias")
    if problem is None and value.isdigit():
        problem = f"An alias cannot be a number (got {value!r}); numbers are versions."
    if problem:
        raise RegistryError(problem)
    return value


def version(value: Any) -> int | str | None:
    """``None`` (the newest), a version number (an int or digits), or an alias; else ``RegistryError``."""
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value):
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_VERSION:
            raise RegistryError(f"A version is a number from 1 to {MAX_VERSION} (got {value}).")
        return value
    if isinstance(value, str):
        return alias(value)
    raise RegistryError(
        f"`version` must be a version number, an alias or None (got {value!r} that is a {type(value).__name__})."
    )


def parse_ref(ref: Any) -> tuple[str, int | str | None]:
    """``"digits"``, ``"digits:3"`` or ``"digits@production"`` -> ``(key, version or alias or None)``."""
    if not isinstance(ref, str):
        raise RegistryError(
            f"A model reference is a string like 'digits', 'digits:3' or 'digits@production' (got {ref!r})."
        )
    if "@" in ref:
        k, a = ref.split("@", 1)
        return key(k), alias(a)
    if ":" in ref:
        k, v = ref.split(":", 1)
        if not (v.isascii() and v.isdigit()):
            raise RegistryError(f"In {ref!r}, what follows ':' must be a version number; use 'KEY@ALIAS' for an alias.")
        return key(k), version(v)
    return key(ref), None


def route_app_name(route: str) -> str:
    """The Serve application's name a route gets unless its settings name one: ``/digits/v2`` ->
    ``digits_v2``, ``/`` -> ``root``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", route.strip("/")) or "root"
