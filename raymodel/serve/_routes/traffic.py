"""The model server's choices, without Ray: which version answers a request, how a shadow's answer
compares with the answered one, and the figures kept per version.

A weighted split maps each request key to a point ``u`` in [0, 1) (the first 8 bytes of the key's
BLAKE2b digest; a random point without one) and answers it with the reference whose share of
[0, 1) holds ``u``, the shares laid end to end in the order given. The same key therefore always
lands on the same reference while the split stands, and a new split moves only the keys whose
point changes share.
"""

from __future__ import annotations

import collections
import hashlib
import math
import random
import time
from typing import Any, Iterable, Mapping

from raymodel._internal.name_rules import parse_ref
from raymodel.exceptions import RegistryError, SettingsError

#: The request header that makes a split sticky (the same key, the same version).
KEY_HEADER = "x-raymodel-key"
#: The answer header naming the version that answered; on a multiplexed route, also the request
#: header that chooses it.
MODEL_HEADER = "x-raymodel-model"
#: On a route of several versions, the answer header naming the process of the replica that answered.
REPLICA_HEADER = "x-raymodel-replica"


def check_split(split: Any) -> dict[str, float]:
    """``{ref: weight}`` checked: at least one registry reference, weights positive numbers that sum to 1."""
    if not isinstance(split, Mapping) or not split:
        raise SettingsError(
            "A split is a dict of registry references and weights, like "
            f"{{'digits@production': 0.9, 'digits@candidate': 0.1}} (got {split!r})."
        )
    out: dict[str, float] = {}
    for ref, weight in split.items():
        check_ref(ref, "A split's key")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise SettingsError(f"The weight of {ref!r} must be a positive number (got {weight!r}).")
        out[ref] = float(weight)
    total = sum(out.values())
    if abs(total - 1.0) > 1e-6:
        raise SettingsError(
            f"A split's weights must sum to 1 (got {total:g}: "
            + ", ".join(f"{r}={w:g}" for r, w in out.items())
            + "); e.g. {'digits@production': 0.9, 'digits@candidate': 0.1}."
        )
    return out


def check_ref(ref: Any, what: str = "A reference") -> tuple[str, Any]:
    """``(key, version or alias or None)`` of a registry reference; a ``SettingsError`` naming ``what`` if bad."""
    try:
        return parse_ref(ref)
    except RegistryError as exc:
        raise SettingsError(f"{what} {ref!r} is not a registry reference: {exc}") from None


def point(key: str | None) -> float:
    """Where a request key falls in [0, 1): the same key, the same point, on every replica and run.
    A well-mixed hash: sequential keys (``user-0``, ``user-1``, ...) spread like random ones (CRC-32,
    scaled, gave a 10% share 6.4% of 1,000 of them)."""
    if not key:
        return random.random()
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64


def pick(shares: list[tuple[str, float]], u: float) -> str:
    """The reference whose share holds ``u`` (shares laid end to end, in order)."""
    edge = 0.0
    for ref, weight in shares:
        edge += weight
        if u < edge:
            return ref
    return shares[-1][0]  # rounding: the last share runs to 1


def compare(answered: Any, shadow: Any) -> tuple[bool, list[float]]:
    """Whether a shadow's answer agrees with the answered one, and the absolute differences of their
    numbers. Agreement: the same structure, and equal labels, classes, ints and strings (the
    decisions); floats decide only in an answer that has nothing else (a regression), and then
    agree within ``math.isclose`` (relative 1e-5)."""
    decisions_a, numbers_a = _leaves(answered)
    decisions_s, numbers_s = _leaves(shadow)
    if [p for p, _ in numbers_a] != [p for p, _ in numbers_s] or [p for p, _ in decisions_a] != [
        p for p, _ in decisions_s
    ]:
        return False, []
    diffs = [abs(a - s) for (_, a), (_, s) in zip(numbers_a, numbers_s)]
    if decisions_a:
        return decisions_a == decisions_s, diffs
    agree = all(math.isclose(a, s, rel_tol=1e-5, abs_tol=1e-8) for (_, a), (_, s) in zip(numbers_a, numbers_s))
    return agree, diffs


def _leaves(value: Any, path: str = "") -> tuple[list[tuple[str, Any]], list[tuple[str, float]]]:
    """``(decisions, numbers)``: every leaf of a JSON answer with its path; floats are numbers."""
    decisions: list[tuple[str, Any]] = []
    numbers: list[tuple[str, float]] = []
    if isinstance(value, Mapping):
        items: Any = sorted(value.items(), key=lambda kv: str(kv[0]))
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif isinstance(value, float):
        return [], [(path, value)]
    else:
        return [(path, value)], []
    for k, v in items:
        d, n = _leaves(v, f"{path}/{k}")
        decisions += d
        numbers += n
    return decisions, numbers


class VersionStats:
    """The last requests answered by each version (end time, latency, failed) and a shadow's tallies."""

    def __init__(self, keep: int = 5000) -> None:
        self.keep = keep
        self.requests: dict[str, collections.deque[tuple[float, float, bool]]] = {}
        self.errors: collections.Counter[str] = collections.Counter()
        self.shadow: dict[str, Any] = {}
        self.started = time.time()

    def record(self, label: str, latency_s: float, failed: bool) -> None:
        queue = self.requests.get(label)
        if queue is None:
            queue = self.requests[label] = collections.deque(maxlen=self.keep)
        queue.append((time.time(), latency_s, failed))
        if failed:
            self.errors[label] += 1

    def answered(self) -> list[tuple[float, float]]:
        """Every version's kept requests as ``(end time, latency s)``: the whole route's."""
        return [(end, lat) for queue in self.requests.values() for end, lat, _ in list(queue)]

    def record_shadow(self, label: str, answered: str, agree: bool | None, diffs: list[float], failed: bool) -> None:
        """One shadow answer: ``agree`` ``None`` when either side failed (counted, not compared)."""
        s = self.shadow.setdefault(
            label, {"answered": answered, "sent": 0, "compared": 0, "agreed": 0, "errors": 0, "diff_sum": 0.0, "n": 0}
        )
        s["answered"] = answered
        s["sent"] += 1
        s["errors"] += int(failed)
        if agree is not None:
            s["compared"] += 1
            s["agreed"] += int(agree)
            s["diff_sum"] += sum(diffs)
            s["n"] += len(diffs)

    def summary(self, window_s: float = 60.0) -> dict[str, Any]:
        """Per version over the last ``window_s`` seconds: requests, rate, p50/p99 (ms), errors; and
        each shadow's agreement rate and mean absolute difference since the route started."""
        now = time.time()
        span = max(1e-9, min(window_s, now - self.started))
        versions = {}
        for label, queue in self.requests.items():
            recent = [(lat, failed) for end, lat, failed in list(queue) if now - end <= window_s]
            latencies = sorted(lat for lat, _ in recent)
            versions[label] = {
                "requests": len(recent),
                "rate_per_s": round(len(recent) / span, 3),
                "p50_ms": _quantile(latencies, 0.5),
                "p99_ms": _quantile(latencies, 0.99),
                "errors": sum(failed for _, failed in recent),
                "errors_total": self.errors[label],
            }
        shadows = {
            label: {
                "answered": s["answered"],
                "sent": s["sent"],
                "compared": s["compared"],
                "agreement": round(s["agreed"] / s["compared"], 4) if s["compared"] else None,
                "mean_abs_diff": s["diff_sum"] / s["n"] if s["n"] else None,
                "errors": s["errors"],
            }
            for label, s in self.shadow.items()
        }
        return {"versions": versions, "shadow": shadows, "window_s": window_s}


def window_figures(
    requests: Iterable[tuple[float, float]],
    batches: Iterable[tuple[float, int]],
    window_s: float,
    started: float,
    now: float | None = None,
) -> dict[str, Any]:
    """A route's figures over the last ``window_s`` seconds, from the requests themselves:
    ``requests`` ``(end time, latency s)`` and ``batches`` ``(end time, size)``: how many requests,
    their rate (over the window, or the time since ``started`` when that is shorter), p50/p99 of all
    their latencies (ms), and the mean size of the batches run in the window."""
    now = time.time() if now is None else now
    span = max(1e-9, min(window_s, now - started))
    latencies = sorted(lat for end, lat in requests if now - end <= window_s)
    sizes = [size for end, size in batches if now - end <= window_s]
    return {
        "requests": len(latencies),
        "rate_per_s": round(len(latencies) / span, 3),
        "p50_ms": _quantile(latencies, 0.5),
        "p99_ms": _quantile(latencies, 0.99),
        "mean_batch_size": round(sum(sizes) / len(sizes), 3) if sizes else None,
        "window_s": window_s,
    }


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return round(1000 * sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))], 3)


def multiplexed_stats(
    info: dict[str, Any], figures: VersionStats, batches: list[Any], window_s: float
) -> dict[str, Any]:
    """The dashboard's figures of a route of a key's versions (any chosen per request) over the last
    ``window_s`` seconds: the whole route's, from the requests it answered and their batches, and per version."""
    versions = figures.summary(window_s)["versions"]
    return {
        "route": info.get("route"),
        "serving": ", ".join(sorted(versions)) or info.get("multiplex"),
        **window_figures(figures.answered(), batches, window_s, figures.started),
        "versions": versions,
        "shadows": {},
        "split": None,
        "refs": {},
    }
