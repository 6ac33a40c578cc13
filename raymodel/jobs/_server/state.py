"""What the training server's parts share: the state ``JobServer.__init__`` makes, and the methods one
part calls on another. ``Scheduler``, ``PoolKeeper``, ``JobControl`` and ``Recovery`` derive from it, so
each is checked against one declaration of the server's state."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import ray


class ServerState:
    """The attributes of a ``JobServer`` (declared here, assigned in its ``__init__``)."""

    pool_idle_s: float
    limits: dict[str, float]
    records: dict[str, dict[str, Any]]  # job id -> its record (what ``_store`` saves)
    payloads: dict[str, bytes]  # job id -> the pickled model class, config, settings and data
    extras: dict[str, dict[str, Any]]  # job id -> its pool's spec, its hub
    runners: dict[str, Any]  # job id -> its JobRunner actor
    done_refs: dict[Any, str]  # a runner's end -> its job id
    pools: dict[str, dict[str, Any]]  # pool id -> its record
    pool_actors: dict[str, Any]  # pool id -> its PoolActor
    pool_refs: dict[Any, str]  # each pool's end -> its id
    ready_refs: dict[Any, str]  # each pool's readiness (every worker started) -> its id
    warm_pools: dict[str, tuple[dict[str, Any], dict[str, float]]]  # pool key -> (spec, needs): kept warm
    row_times: dict[str, list[float]]  # when each row arrived (epoch times: ETAs)
    alive_nodes: set[str]
    lost_nodes: dict[str, float]  # node id -> when it was seen dead
    spare: Any  # a started JobRunner for the next job, or None
    warm_runs: tuple[str, ...]  # what the spare runner starts ahead (`Backend.runner_warm`: `--warm rllib`)
    lock: threading.RLock
    changed: threading.Condition  # a row, a status: wakes the clients' long polls
    wake: threading.Event  # a watched call ended (``watch``): ends the loop's wait
    _pruned: float
    _swept: float
    _demand_checked: float
    _warmed: float  # when warm pools were last looked at (monotonic)
    _room_seen: bool  # whether the last look found room for them
    _nodes_checked: float
    draining: bool  # the head is going down (`raymodel server stop`): no job starts

    def watch(self, refs: dict[Any, str], ref: Any, owner: str) -> None:
        """Watch ``ref`` (a runner's job, a pool's end or readiness) in ``refs``: the server's loop wakes
        when it ends, also when the call began while the loop was already waiting (a job ``submit``
        launched), rather than at the end of that wait."""
        refs[ref] = owner
        ref.future().add_done_callback(lambda _: self.wake.set())

    def warm_imports(self) -> tuple[str, ...]:
        """The modules a job on one of the warm pools imports (its runner imports them ahead)."""
        from raymodel.jobs._warm import runner_imports

        return runner_imports([name for spec, _ in self.warm_pools.values() for name in spec["names"]])

    def ended(self) -> list[Any]:
        """The watched calls that have ended (a job's, a pool's end or readiness), without waiting."""
        refs = list(self.done_refs) + list(self.pool_refs) + list(self.ready_refs)
        return ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else []

    if TYPE_CHECKING:  # defined by JobServer and its parts; declared for the others

        def _log(self, job_id: str, line: str) -> None: ...

        def _save(self, job_id: str) -> None: ...

        def _finish(
            self, job_id: str, status: str, result: Any = None, error: str | None = None, detail: str | None = None
        ) -> None: ...

        def _start_pool(self, record: dict[str, Any]) -> str: ...

        def _end_pool(self, pool_id: str, why: str, force: bool = False) -> None: ...

        def _abandon(self, record: dict[str, Any], why: str = "") -> None: ...


def tagged(record: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A row of a release job without a stage is one of its training's epochs: ``"stage": "train"``."""
    if record.get("kind") == "release" and "stage" not in row:
        row["stage"] = "train"
    return row
