"""What a release is given: ``rm.Gate`` (may the candidate go out?) and ``rm.RolloutPlan`` (how it
goes out), checked before anything runs; the gate's decision on two scores; its stages in words;
and how it ended (``ReleaseResult``, what its ``wait()`` returns)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from raymodel._internal import name_rules
from raymodel.exceptions import RegistryError, SettingsError

#: A release's stages, in order (``job.stage``; each ends with a row of the job's history).
STAGES = ("train", "evaluate", "register", "rollout", "promote")


@dataclasses.dataclass(frozen=True)
class Gate:
    """When a release's candidate may replace the version in production.

    The candidate and the version ``against`` names are scored on the same held-out split (the
    data's ``valid`` split, or ``data``) by the model's own validation, in the cluster.

    Attributes:
        metric: A figure the model's validation reports, e.g. ``"val_acc"``.
        mode: ``"max"`` (higher is better) or ``"min"``.
        min_delta: How much better than ``against`` the candidate must score; negative: it may be
            up to that much worse (``-0.01``: accept a candidate at most 0.01 behind).
        against: The version to beat, a registry reference (``"digits@production"``). ``None``,
            or a reference that names no version yet (the first release): the candidate passes
            on ``threshold`` alone, or passes if no threshold is given. A figure that is not a
            finite number never passes.
        threshold: The score the candidate must reach (at least, for ``"max"``; at most, for
            ``"min"``) whatever ``against`` scores.
        data: Held-out data to score on instead of the release's ``valid`` split.
    """

    metric: str
    mode: str = "max"
    min_delta: float = 0.0
    against: str | None = None
    threshold: float | None = None
    data: Any = None

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.metric, str) or not self.metric:
            problems.append(
                f"`metric` names a figure the model's validation reports, e.g. 'val_acc' (got {self.metric!r})."
            )
        if self.mode not in ("max", "min"):
            problems.append(f"`mode` is 'max' or 'min' (got {self.mode!r}).")
        if not _finite(self.min_delta):
            problems.append(f"`min_delta` must be a number (got {self.min_delta!r}).")
        if self.threshold is not None and not _finite(self.threshold):
            problems.append(f"`threshold` must be a number or None (got {self.threshold!r}).")
        if self.against is not None:
            try:
                name_rules.parse_ref(self.against)
            except RegistryError as exc:
                problems.append(f"`against` must be a registry reference like 'digits@production' ({exc}).")
        if problems:
            raise SettingsError("Gate: " + " ".join(problems))

    @classmethod
    def coerce(cls, value: Any) -> Gate:
        return _coerce(cls, value, "gate")


@dataclasses.dataclass(frozen=True)
class RolloutPlan:
    """How a release's candidate goes out on its route: ``served.rollout``'s arguments.

    Attributes:
        steps: The candidate's shares, increasing, ending at 1.0.
        step_s: The least time a step lasts (it also waits for ``guard.min_requests``).
        guard: ``rm.Guard`` (or a dict of its fields): a breach rolls the route back at once.
    """

    steps: tuple[float, ...] = (0.1, 0.5, 1.0)
    step_s: float = 30.0
    guard: Any = None

    def __post_init__(self) -> None:
        from raymodel.serve import Guard, check_steps  # Serve's modules only for a release

        steps, step_s = check_steps(self.steps, self.step_s)
        if steps[-1] != 1.0:
            raise SettingsError(
                f"RolloutPlan: `steps` must end at 1.0, the candidate serving alone (got {tuple(self.steps)})."
            )
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "step_s", step_s)
        object.__setattr__(self, "guard", Guard.coerce(self.guard))

    @classmethod
    def coerce(cls, value: Any) -> RolloutPlan:
        return cls() if value is None else _coerce(cls, value, "rollout")


@dataclasses.dataclass(frozen=True)
class ReleaseResult:
    """How a release ended.

    Attributes:
        status: ``"SUCCEEDED"`` (promoted), ``"REJECTED"`` (the gate), ``"ROLLED_BACK"`` (the guard)
            or ``"STOPPED"``.
        reason: Why, with the figures that decided it.
        version: The version it registered (``"digits:4"``); ``None`` when it ended before registering.
        stages: Each stage's row, in order: ``{"stage", "start", "end", ...its figures}``.
        train: The training's ``TrainResult`` fields, when this runner trained (not after a restart).
    """

    status: str
    reason: str
    version: str | None = None
    stages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    train: dict[str, Any] | None = None

    def stage(self, name: str) -> dict[str, Any] | None:
        """The row of the stage ``name`` (``"evaluate"``: both sides' figures), if it ended."""
        return next((row for row in self.stages if row["stage"] == name), None)


def decide(gate: Gate, candidate: float, against: float | None) -> tuple[bool, str]:
    """Whether the candidate passes ``gate`` on its score and ``against``'s (``None``: no version to
    beat), and why, with both figures."""
    better = (lambda a, b: a >= b) if gate.mode == "max" else (lambda a, b: a <= b)
    sign = 1.0 if gate.mode == "max" else -1.0
    name = gate.metric
    if not math.isfinite(candidate):  # a diverged candidate, whatever the gate's other terms
        return False, f"{name} {candidate} is not a finite number"
    if gate.threshold is not None and not better(candidate, gate.threshold):
        return False, f"{name} {candidate:.6g} does not reach the threshold {gate.threshold:.6g} ({gate.mode})"
    if against is None:
        why = f"{name} {candidate:.6g}" + (
            f" reaches the threshold {gate.threshold:.6g}" if gate.threshold is not None else ""
        )
        return True, f"{why}; no version to beat"
    needed = against + sign * gate.min_delta
    if not better(candidate, needed):
        return False, (
            f"{name} {candidate:.6g} against {against:.6g} of {gate.against}: "
            f"{'max' if gate.mode == 'max' else 'min'} mode needs {needed:.6g} (min_delta {gate.min_delta:g})"
        )
    return True, f"{name} {candidate:.6g} against {against:.6g} of {gate.against} (min_delta {gate.min_delta:g})"


def figure_of(gate: Gate, figures: Mapping[str, float] | None, who: str) -> float | None:
    """The gate's metric among ``who``'s scored figures (``None``: no such side); a metric its
    validation does not report is an error naming those it does."""
    if figures is None:
        return None
    if gate.metric not in figures:
        raise SettingsError(
            f"The gate's metric `{gate.metric}` is not among the figures {who}'s validation reports "
            f"({', '.join(sorted(figures)) or 'none'}); name one of them: `rm.Gate(metric=...)`."
        )
    return float(figures[gate.metric])


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _coerce(cls: Any, value: Any, what: str) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise SettingsError(
                f"{cls.__name__} has no field(s) {', '.join(map(repr, unknown))}; it takes {', '.join(fields)}."
            )
        return cls(**value)
    raise SettingsError(f"`{what}` takes rm.{cls.__name__}(...) or a dict of its fields (got {type(value).__name__}).")


def current_stage(history: list[dict[str, Any]], status: str) -> str:
    """The stage under way (the one after the last that ended), or the last one of a job that ended."""
    ended = [row["stage"] for row in history if row.get("stage") in STAGES and "end" in row]
    if not ended:
        return "train"
    if status not in ("PENDING", "RUNNING"):
        return ended[-1]
    return STAGES[min(STAGES.index(ended[-1]) + 1, len(STAGES) - 1)]


def describe(row: dict[str, Any]) -> str:
    """One stage row in words: ``"evaluate (1.2 s): val_acc 0.93 against 0.91 of digits:1: passed"``."""
    took = f"{row['stage']} ({row['end'] - row['start']:.1f} s)"
    if row["stage"] == "train":
        shown = {k: v for k, v in (row.get("metrics") or {}).items() if isinstance(v, (int, float)) and k != "epoch"}
        return f"{took}: " + "  ".join(f"{k} {v:.4g}" for k, v in shown.items())
    if row["stage"] == "evaluate":
        return f"{took}: {row['reason']}: {'passed' if row['passed'] else 'rejected'}"
    if row["stage"] == "register":
        return f"{took}: {row['version']}"
    if row["stage"] == "rollout":
        return f"{took} on {row['route']}: {row['status']}: {row['reason']}"
    return f"{took}: " + (f"{row['alias']} names the new version" if row.get("alias") else "no alias to move")
