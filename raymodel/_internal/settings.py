"""Validated, keyword-only settings dataclasses.

Each verb has one settings class (``TrainSettings``, ``TuneSettings``,
``ServeSettings``). They share the machinery here: unknown keys get a
"did you mean" suggestion, every bad value is named with what is allowed, and
all problems are reported together in one :class:`SettingsError`, before any
Ray resource is taken.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping, TypeVar

from raymodel.exceptions import SettingsError

S = TypeVar("S")


def settings_class(cls: type[S]) -> type[S]:
    """Make ``cls`` a keyword-only dataclass whose constructor validates its keys.

    The class may define ``_validate(self) -> list[str]`` returning problems.
    """
    cls = dataclasses.dataclass(kw_only=True)(cls)
    dataclass_init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args:
            raise SettingsError(
                f"`{cls.__name__}` takes keyword arguments only "
                f"(got {len(args)} positional); write e.g. `{cls.__name__}({names[0]}=...)`."
            )
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            raise SettingsError(_unknown_keys_message(cls.__name__, unknown, names))
        dataclass_init(self, **kwargs)
        problems = self._validate() if hasattr(self, "_validate") else []
        if problems:
            bullet = "\n  - "
            raise SettingsError(f"Invalid `{cls.__name__}`:{bullet}{bullet.join(problems)}")

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


class SettingsBase:
    """Base of the settings classes: :meth:`coerce` accepts an instance, a dict or ``None``."""

    @classmethod
    def coerce(cls: type[S], value: Any) -> S:
        """Return ``value`` as a ``cls``: ``None`` gives the defaults, a dict is validated."""
        return _coerce(cls, value)


def _unknown_keys_message(owner: str, unknown: list[str], names: list[str]) -> str:
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        parts.append(f"`{owner}` has no setting `{key}`.{hint}")
    allowed = ", ".join(f"`{n}`" for n in names)
    return " ".join(parts) + f" Allowed settings: {allowed}."


def _coerce(cls: type[S], value: Any) -> S:
    """Return ``value`` as a ``cls``: ``None`` gives the defaults, a dict is validated."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise SettingsError(f"`{cls.__name__}` keys must be strings (got {bad[0]!r}).")
        return cls(**dict(value))
    raise SettingsError(
        f"Expected a `{cls.__name__}` or a dict of its settings "
        f"(got {value!r} that is a {type(value).__name__})."
    )


# ----------------------------------------------------------------- checkers
# Each returns a problem string or None, so ``_validate`` can collect them all.


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: int | None = None, allow_none: bool = False) -> str | None:
    if value is None and allow_none:
        return None
    if not _is_int(value) or (minimum is not None and value < minimum):
        floor = f" >= {minimum}" if minimum is not None else ""
        none = " or None" if allow_none else ""
        return f"`{name}` must be an int{floor}{none} (got {value!r})."
    return None


def check_number(
    name: str, value: Any, minimum: float | None = None, maximum: float | None = None,
    allow_none: bool = False, exclusive_min: bool = False,
) -> str | None:
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and minimum is not None:
        ok = value > minimum if exclusive_min else value >= minimum
    if ok and maximum is not None:
        ok = value <= maximum
    if not ok:
        lo = "" if minimum is None else (f" > {minimum}" if exclusive_min else f" >= {minimum}")
        hi = "" if maximum is None else f" <= {maximum}"
        none = " or None" if allow_none else ""
        return f"`{name}` must be a number{lo}{hi}{none} (got {value!r})."
    return None


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> str | None:
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        return f"`{name}` must be one of {allowed} (got {value!r})."
    return None


def check_type(name: str, value: Any, types: tuple[type, ...], what: str, allow_none: bool = False) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
        return f"`{name}` must be {what} (got {value!r} that is a {type(value).__name__})."
    return None


def collect(*problems: str | None) -> list[str]:
    return [p for p in problems if p]
