"""The training server's queue policy, as plain functions of job records: order, preemption, ETA.

Kept apart from the server actor so that the policy is tested without a cluster.
A record here is the server's ``JobRecord`` (``jobs/_server/records.py``).
"""

from __future__ import annotations

import itertools
import statistics
from typing import Callable, Iterable

from raymodel.jobs._server.records import JobRecord

Resources = dict[str, float]


def fits(needs: Resources, free: Resources) -> str | None:
    """``None`` when ``needs`` fits ``free``, else the reason (which resource it waits for)."""
    for name, amount in sorted(needs.items()):
        have = free.get(name, 0.0)
        if amount > have + 1e-9:
            return f"waiting for {name}: needs {amount:g}, {have:g} free"
    return None


def plus(a: Resources, b: Resources, sign: float = 1.0) -> Resources:
    return {k: a.get(k, 0.0) + sign * b.get(k, 0.0) for k in set(a) | set(b)}


def queue_order(records: Iterable[JobRecord]) -> list[JobRecord]:
    """The PENDING jobs in the order they start: higher ``priority`` first, then first submitted."""
    pending = [r for r in records if r.status == "PENDING"]
    return sorted(pending, key=lambda r: (-r.priority, r.submitted))


def preemptible_by(job: JobRecord, running: Iterable[JobRecord]) -> list[JobRecord]:
    """The running jobs ``job`` may preempt, the first to go first: lower priority, preemptible, a
    training run (a tune job's trials are jobs of their own), not already on its way out; the lowest
    priority first, and among equals the most recently started (it loses the least work)."""
    candidates = [
        r
        for r in running
        if r.kind == "train" and r.preemptible and r.priority < job.priority and not r.preempting and not r.stopping
    ]
    return sorted(candidates, key=lambda r: (r.priority, -(r.started or 0.0)))


def choose_victims(job: JobRecord, running: list[JobRecord], free: Resources) -> tuple[list[JobRecord], bool]:
    """``(victims, enough)``: the fewest running jobs to preempt so that ``job`` fits, in order, and
    whether that is enough. Jobs already being preempted count as freed."""
    room = dict(free)
    for r in running:
        if r.preempting:
            room = plus(room, r.needs)
    victims: list[JobRecord] = []
    for candidate in preemptible_by(job, running):
        if fits(job.needs, room) is None:
            break
        victims.append(candidate)
        room = plus(room, candidate.needs)
    return victims, fits(job.needs, room) is None


def epoch_seconds(record: JobRecord, row_times: list[float]) -> float | None:
    """The seconds per epoch of a running job so far: the median time between its rows, so that one
    slow epoch (a checkpoint, a busy node) does not move every ETA (``None`` before its first row)."""
    if len(row_times) >= 2:
        return statistics.median(b - a for a, b in itertools.pairwise(row_times))
    if row_times and record.started:
        return max(row_times[0] - record.started, 1e-3)
    return None


def remaining(record: JobRecord, row_times: list[float], now: float) -> float | None:
    """Seconds until a running job ends: its epochs left times its epoch time, less the time
    its current epoch has run (``None`` when not known yet)."""
    per_epoch = epoch_seconds(record, row_times)
    if per_epoch is None or not record.epochs:
        return None
    left = max(int(record.epochs) - record.last_epoch, 0) * per_epoch
    since = now - (row_times[-1] if row_times else record.started or now)
    return max(left - since, 0.0)


def etas(
    records: list[JobRecord],
    free: Resources,
    row_times: Callable[[str], list[float]],
    now: float,
) -> dict[str, float | None]:
    """``{job id: seconds}``: for a RUNNING job until it ends, for a PENDING one until it starts.

    The queue is played forward: each running job gives its resources back when it is expected to
    end; each PENDING job, in queue order, starts at the first of those moments when it fits, and
    holds its resources from then on (its own end unknown). ``None``: not known (a job ahead has no
    epoch time yet, or nothing running frees enough).
    """
    out: dict[str, float | None] = {}
    ends: list[tuple[float, Resources]] = []
    for record in records:
        if record.status != "RUNNING":
            continue
        left = remaining(record, row_times(record.id), now)
        out[record.id] = left
        if left is not None:
            ends.append((left, record.needs))
    ends.sort(key=lambda e: e[0])
    room = dict(free)
    for record in queue_order(records):
        start = None
        trial, t = dict(room), 0.0
        if fits(record.needs, trial) is None:
            start = 0.0
        else:
            for end, needs in ends:
                trial = plus(trial, needs)
                t = end
                if fits(record.needs, trial) is None:
                    start = t
                    break
        out[record.id] = start
        if start is None:
            break  # those behind it are not known either
        # From ``start`` on it holds its share: take it from the room at that moment.
        room = plus(trial, record.needs, -1.0)
        ends = [(end, needs) for end, needs in ends if end > start]
    return out
