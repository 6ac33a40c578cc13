"""Validated, keyword-only, frozen settings dataclasses.

Each verb has one settings class (``TrainSettings``, ``TuneSettings``,
``ServeSettings``). They share the machinery here: unknown keys get a
"did you mean" suggestion, every bad value is named with what is allowed, and
all problems (unknown keys and bad values alike) are reported together in one
``SettingsError``, before any Ray resource is taken. Settings objects
are frozen; the verbs check them again when they use them, so a dict inside
one that was changed after construction is caught too.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Mapping, Sequence, TypeVar, dataclass_transform

from raymodel.exceptions import SettingsError

S = TypeVar("S")

#: Seeds feed numpy's generators, which take 0 <= seed < 2**32.
MAX_SEED = 2**32 - 1

_DAY = 86_400
#: The upper bound of every numeric setting (of ``TrainSettings``, ``TuneSettings`` and ``ServeSettings``),
#: by name: far above any real use, low enough that a typo (``num_epochs=10**18``) is refused at once
#: instead of running for ever or reserving absurd memory. ``priority`` is bounded below by its negative.
LIMITS: dict[str, float] = {
    # TrainSettings
    "num_workers": 10_000,
    "num_epochs": 1_000_000,
    "batch_size": 1 << 24,
    "max_failures": 10_000,
    "checkpoint_every": 1_000_000,
    "keep_checkpoints": 100_000,
    "priority": 1_000_000,
    "resource_wait_s": 7 * _DAY,
    "elastic_resize_s": _DAY,
    "elastic_wait_s": _DAY,
    "accumulate_grad_batches": 1_000_000,
    "grad_clip_norm": 1e9,
    "grad_clip_value": 1e9,
    # TuneSettings
    "num_samples": 100_000,
    "max_epochs": 1_000_000,
    "grace_period": 1_000_000,
    "reduction_factor": 1_000,
    "perturbation_interval": 1_000_000,
    "time_budget_s": 365 * _DAY,
    "max_concurrent_trials": 10_000,
    # ServeSettings
    "num_replicas": 10_000,
    "min_replicas": 10_000,
    "max_replicas": 10_000,
    "target_ongoing_requests": 100_000,
    "upscale_delay_s": _DAY,
    "downscale_delay_s": _DAY,
    "look_back_period_s": _DAY,
    "max_batch_size": 100_000,
    "batch_wait_timeout_s": 60,
    "max_ongoing_requests": 100_000,
    "max_body_bytes": 1 << 31,
    "registry_poll_s": _DAY,
    "max_models_per_replica": 1_000,
}
#: Of every amount in a Ray resource dict (``resources_per_worker``, ``ray_actor_options``): 10 TB of
#: ``memory`` in bytes; Ray keeps amounts as fixed-point int64, which overflows not far above.
MAX_RESOURCE = 10**13
#: Settings bounded below by the negative of their limit.
_SIGNED = {"priority"}


@dataclass_transform(kw_only_default=True, frozen_default=True)
def settings_class(cls: type[S]) -> type[S]:
    """Make ``cls`` a frozen, keyword-only dataclass whose constructor validates its keys (type checkers
    see the dataclass, PEP 681: ``TrainSettings(num_epoch=3)`` is flagged in the user's editor too).

    The class may define ``_validate(self) -> list[str]`` returning problems; it
    may normalize fields with ``object.__setattr__`` (the instance is frozen).
    """
    cls = dataclasses.dataclass(kw_only=True, frozen=True)(cls)
    dataclass_init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    groups: dict[str, tuple[str, ...]] = getattr(cls, "GROUPS", None) or {"": tuple(names)}
    grouped = [n for members in groups.values() for n in members]
    if sorted(grouped) != sorted(names):  # a field added without a group (a developer's mistake)
        raise TypeError(f"`{cls.__name__}.GROUPS` must name each field once (fields: {names}, grouped: {grouped}).")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            raise SettingsError(
                f"`{cls.__name__}` takes keyword arguments only "
                f"(got {len(args)} positional); write e.g. `{cls.__name__}({names[0]}=...)`."
            )
        unknown = [k for k in kwargs if k not in names]
        dataclass_init(self, **{k: v for k, v in kwargs.items() if k in names})
        problems = [_unknown_keys_message(cls.__name__, unknown, groups)] if unknown else []
        problems += self._validate() if hasattr(self, "_validate") else []
        _raise(cls.__name__, problems)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def _raise(owner: str, problems: list[str]) -> None:
    if len(problems) == 1 and problems[0].startswith(f"`{owner}` has no setting"):
        raise SettingsError(problems[0])
    if problems:
        bullet = "\n  - "
        raise SettingsError(f"Invalid `{owner}`:{bullet}{bullet.join(problems)}")


class SettingsBase:
    """Base of the settings classes: ``coerce`` accepts an instance, a dict or ``None``."""

    @classmethod
    def coerce(cls: type[S], value: Any) -> S:
        """Return ``value`` as a ``cls``: ``None`` gives the defaults, a dict is validated,
        an instance is checked again (a dict inside it may have been changed since)."""
        return _coerce(cls, value)

    def _validate(self) -> list[str]:
        return []


def _unknown_keys_message(owner: str, unknown: list[str], groups: Mapping[str, Sequence[str]]) -> str:
    names = [n for members in groups.values() for n in members]
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        parts.append(f"`{owner}` has no setting `{key}`.{hint}")
    allowed = "; ".join(
        (f"{group}: " if group else "") + ", ".join(f"`{n}`" for n in members) for group, members in groups.items()
    )
    return " ".join(parts) + f" Allowed settings: {allowed}."


def _coerce(cls: type[S], value: Any) -> S:
    """Return ``value`` as a ``cls``: ``None`` gives the defaults, a dict is validated."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        _raise(cls.__name__, value._validate())  # type: ignore[attr-defined]
        return value
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise SettingsError(f"`{cls.__name__}` keys must be strings (got {bad[0]!r}).")
        return cls(**dict(value))
    raise SettingsError(
        f"Expected a `{cls.__name__}` or a dict of its settings (got {value!r} that is a {type(value).__name__})."
    )


# ----------------------------------------------------------------- checkers
# Each returns a problem string or None, so ``_validate`` can collect them all.


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(
    name: str, value: Any, minimum: int | None = None, allow_none: bool = False, maximum: int | None = None
) -> str | None:
    if value is None and allow_none:
        return None
    if maximum is None and name in LIMITS:
        maximum = int(LIMITS[name])
    if minimum is None and name in _SIGNED:
        minimum = -int(LIMITS[name])
    if not _is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        floor = f" >= {minimum}" if minimum is not None else ""
        ceiling = f" <= {maximum}" if maximum is not None else ""
        both = f" from {minimum} to {maximum}" if floor and ceiling else floor or ceiling
        none = " or None" if allow_none else ""
        return f"`{name}` must be an int{both}{none} (got {value!r})."
    return None


def check_resources(name: str, value: Any, allow_none: bool = True) -> str | None:
    """A Ray resource dict: ``{"CPU": 1, "GPU": 0.5, "custom": 2}`` of finite numbers >= 0."""
    if value is None and allow_none:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str)
        and k
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and 0 <= v <= MAX_RESOURCE
        for k, v in value.items()
    ):
        return f"`{name}` must be a dict like {{'CPU': 1}} of finite numbers from 0 to {MAX_RESOURCE} (got {value!r})."
    return None


def check_actor_options(name: str, value: Any) -> list[str]:
    """Ray actor options: a dict whose resource amounts are finite and >= 0."""
    if value is None:
        return []
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return [f"`{name}` must be a dict like {{'num_cpus': 1}} (got {value!r})."]
    problems = [
        check_number(f"{name}['{k}']", value[k], minimum=0, maximum=MAX_RESOURCE)
        for k in ("num_cpus", "num_gpus", "memory")
        if k in value
    ]
    if "resources" in value:
        problems.append(check_resources(f"{name}['resources']", value["resources"], allow_none=False))
    return collect(*problems)


def check_name(name: str, value: Any) -> str | None:
    """A run or experiment name: one plain folder name (it must not escape its storage folder)."""
    from raymodel._internal.name_rules import name_problem

    return None if value is None else name_problem(value, f"`{name}`")


def check_number(
    name: str,
    value: Any,
    minimum: float | None = None,
    maximum: float | None = None,
    allow_none: bool = False,
    exclusive_min: bool = False,
) -> str | None:
    if value is None and allow_none:
        return None
    maximum = LIMITS.get(name, maximum) if maximum is None else maximum
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if exclusive_min else value >= minimum
    if ok and maximum is not None:
        ok = value <= maximum
    if not ok:
        lo = "" if minimum is None else (f" > {minimum}" if exclusive_min else f" >= {minimum}")
        hi = "" if maximum is None else f"{' and' if lo else ''} <= {_plain(maximum)}"
        none = " or None" if allow_none else ""
        return f"`{name}` must be a finite number{lo}{hi}{none} (got {value!r})."
    return None


def _plain(number: float) -> str:
    """``31536000`` rather than ``3.1536e+07``; ``0.05`` as it is."""
    return str(int(number)) if float(number).is_integer() else repr(number)


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


def check_seed(name: str, value: Any, error: type[Exception] = SettingsError) -> None:
    """Raise ``error`` unless ``value`` is a seed numpy takes (an int from 0 to ``MAX_SEED``)."""
    problem = check_int(name, value, minimum=0, maximum=MAX_SEED)
    if problem:
        raise error(problem)


def collect(*problems: str | None) -> list[str]:
    return [p for p in problems if p]
