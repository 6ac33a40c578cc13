"""The training server's records: a job's (``JobRecord``) and a pool's (``PoolRecord``).

A job's record is what ``jobs/_store.py`` saves at every change and what a client reads (``as_dict``:
the stored form, plain JSON). ``JobRecord.from_dict`` reads every stored form, those written before
the records were typed included: a field a record lacks takes its default, and the keys renamed
since are read under their old names (``preempt_by`` is ``preempting``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raymodel.jobs._constants import ACTIVE

#: Stored keys of older servers -> the field they are now.
_RENAMED = {"preempt_by": "preempting"}


@dataclasses.dataclass
class Lost:
    """A running job's workers failed (Ray Train restarts them): when, after which epoch, how many rows
    the job had then (a new row means it resumed), and the nodes lost about then."""

    at: float
    epoch: int
    rows: int
    nodes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class JobRecord:
    """One job of the training server, from its submission to its end.

    What the client asked for (``kind`` to ``pool_key``), where it is (``status``, ``reason``, its rows
    and log), and the marks of what is under way: ``stopping`` (a stop asked, at the next epoch's end),
    ``stop_now`` (a stop that cannot wait for one), ``fail_with`` (the error it ends with, given up by the
    server), ``lost`` (its workers failed), ``preempting`` (the job it gives way to, now) and
    ``preempted_by`` (the job it last gave way to).
    """

    id: str
    kind: str
    status: str = "PENDING"
    reason: str | None = "queued"
    needs: dict[str, float] = dataclasses.field(default_factory=dict)
    model_class: str = "?"
    settings: Any = None
    submitted: float = 0.0
    started: float | None = None
    ended: float | None = None
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    result: Any = None
    error: str | None = None
    log: list[str] = dataclasses.field(default_factory=list)
    epochs: int | None = None
    placement_groups: list[str] = dataclasses.field(default_factory=list)
    trials: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    metric: str | None = None
    mode: str | None = None
    priority: int = 0
    preemptible: bool = True
    resource_wait_s: float | None = None
    changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    preemptions: int = 0
    register: dict[str, Any] | None = None
    registered: str | None = None
    durable: bool = False
    not_durable: str | None = None
    restarts: int = 0
    runtime_env: dict[str, Any] = dataclasses.field(default_factory=dict)
    pool_key: str | None = None
    trial_id: str | None = None
    run_path: str | None = None
    pool_id: str | None = None
    resume: bool = False
    stopping: bool = False
    stop_now: bool = False
    fail_with: str | None = None
    lost: Lost | None = None
    preempting: str | None = None
    preempted_by: str | None = None

    @classmethod
    def from_dict(cls, stored: dict[str, Any]) -> JobRecord:
        """A record from its stored form (any server's); keys no field names are left out."""
        names = {field.name for field in dataclasses.fields(cls)}
        values = {_RENAMED.get(key, key): value for key, value in stored.items()}
        values = {key: value for key, value in values.items() if key in names}
        if isinstance(values.get("lost"), dict):
            values["lost"] = Lost(**values["lost"])
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """The stored form (what a client reads): its fields by name, not copied (the settings as the
        client gave them: storage writes their ``repr``)."""
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        out["lost"] = dataclasses.asdict(self.lost) if self.lost is not None else None
        return out

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def last_epoch(self) -> int:
        """The newest epoch among its rows (0 before the first)."""
        return max((int(row.get("epoch", 0)) for row in self.history), default=0)

    def tagged(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row of a release job without a stage is one of its training's epochs: ``"stage": "train"``."""
        if self.kind == "release" and "stage" not in row:
            row["stage"] = "train"
        return row


@dataclasses.dataclass
class PoolRecord:
    """One pool of the training server (``jobs/_pools/pool.py``), as ``rm.jobs.pools()`` shows it.

    ``state``: ``starting`` (its first job's workers start), ``busy``, ``idle`` or ``ending``; ``ready``:
    every worker has started and asked for a job; ``warm``: kept warm (``jobs/_warm.py``), so not ended
    when idle."""

    id: str
    key: str
    backend: str
    num_workers: int
    needs: dict[str, float]
    state: str
    started: float
    job: str | None = None
    idle_since: float | None = None
    ready: bool = False
    warm: bool = False
    jobs_run: int = 0
    ended_because: str | None = None
    ending_since: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
