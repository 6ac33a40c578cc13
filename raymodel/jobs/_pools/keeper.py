"""``PoolKeeper``: the training server's part that keeps pools: start, hand out, end, list.

A pool (``jobs/_pools/pool.py``) is started for a job that fits no idle one, or ahead of any
job (a warm pool, ``jobs/_warm.py``); it ends after ``pool_idle_s`` idle (a warm one does not), at
once when other work needs its resources (Ray reports pending demand, or ``make_room`` is called),
and is killed when it cannot end. A pool still starting with no job is killed at once when it must
end (its workers would otherwise finish starting only to leave). A warm pool that ended starts
again once the server has no job and the cluster room for it, at two looks 10 s apart.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import ray

from raymodel._ray import cluster, remote
from raymodel.jobs._address import NAMESPACE
from raymodel.jobs._server.book import JobBook
from raymodel.jobs._server.queue import fits
from raymodel.jobs._server.records import JobRecord, PoolRecord
from raymodel.jobs._server.watched import Watched

#: A pool asked to end that has not after this long is killed.
_END_S = 30.0
#: How often the server looks whether a warm pool that ended can start again (it does when two looks
#: in a row find no job, room for it, and nothing waiting for resources).
_REWARM_S = 10.0


class PoolKeeper:
    """The training server's pools, under the book's lock (``JobBook``): its jobs' needs and logs, and
    its ``changed`` for the clients' waits."""

    def __init__(self, book: JobBook, watched: Watched, idle_s: float) -> None:
        self.book, self.watched, self.idle_s = book, watched, float(idle_s)
        self.pools: dict[str, PoolRecord] = {}
        self.actors: dict[str, Any] = {}  # pool id -> its PoolActor
        self.warm_pools: dict[str, tuple[dict[str, Any], dict[str, float]]] = {}  # key -> (spec, needs)
        self.draining = False  # the head is going down: no warm pool starts
        self._warmed = -1e9  # when warm pools were last looked at (monotonic)
        self._room_seen = False  # whether that look found room for them
        self._demand_checked = 0.0

    # ------------------------------------------------------------ clients
    def info(self) -> list[dict[str, Any]]:
        with self.book.lock:
            return [p.as_dict() for p in sorted(self.pools.values(), key=lambda p: p.started)]

    def release(self, timeout: float = 120.0) -> list[str]:
        """End every idle pool and wait until each has ended (its resources are back)."""
        with self.book.changed:
            ending = [p.id for p in self.pools.values() if p.state in ("idle", "ending")]
            for pool_id in ending:
                self.end(pool_id, "released")
            self.book.changed.wait_for(lambda: not any(i in self.pools for i in ending), timeout=timeout)
            return ending

    def make_room(self, needs: dict[str, float] | None, timeout: float = 120.0) -> list[str]:
        """Before other work takes resources: end the idle pools in its way (every idle pool when
        ``needs`` is ``None``), and wait until they have ended."""
        with self.book.lock:
            if not self.idle():
                return []
            if needs is not None:
                available = {k: float(v) for k, v in ray.available_resources().items()}
                if fits(needs, available) is None:
                    return []
        return self.release(timeout)

    def warm(self, specs: list[tuple[str, int]]) -> list[str]:
        """Keep a pool of each ``(backend, workers)`` warm from now on (``jobs/_warm.py``; ``[]``: none):
        those not running start now, in the background. Returns the ids of the pools started."""
        from raymodel.jobs._warm import warm_pools

        with self.book.lock:
            self.warm_pools = warm_pools(specs)
            for pool in self.pools.values():
                pool.warm = pool.key in self.warm_pools
            return self._start_warm(check_room=False)

    # ------------------------------------------------------------ the scheduler's
    def idle(self, key: str | None = None) -> list[PoolRecord]:
        """The idle pools (of ``key``, if given)."""
        return [p for p in self.pools.values() if p.state == "idle" and (key is None or p.key == key)]

    def start_for(self, record: JobRecord) -> str:
        """A new pool for the job ``record`` (its pool's spec came with it)."""
        spec = self.book.extras[record.id]["pool"]
        pool_id = self._new_pool(spec, record.needs, job_id=record.id)
        self.book.log(record.id, f"starting pool {pool_id} of {spec['num_workers']} {_kind(spec)} worker(s)")
        return pool_id

    def take(self, pool_id: str, job_id: str) -> Any:
        """The pool runs the job ``job_id`` now: its actor, for the job's runner."""
        pool = self.pools[pool_id]
        pool.state, pool.job, pool.idle_since = "busy", job_id, None
        return self.actors[pool_id]

    def returned(self, pool_id: str, usable: bool) -> None:
        """The pool's job ended: the pool waits for the next one, or ends when the job left it unusable."""
        pool = self.pools.get(pool_id)
        if pool is None or pool.state != "busy":
            return
        pool.jobs_run += 1
        if usable:
            pool.state, pool.job, pool.idle_since = "idle", None, time.time()
        else:
            self.end(pool_id, "a job left it unusable", force=True)

    # ------------------------------------------------------------ starts
    def _new_pool(self, spec: dict[str, Any], needs: dict[str, float], job_id: str | None) -> str:
        """Start a pool of ``spec`` for the job ``job_id`` (``None``: a warm pool, idle until a job takes it)."""
        from raymodel.jobs._pools.pool import PoolActor

        _coordinator_ahead()
        pool_id = f"pool-{time.strftime('%H%M%S')}-{os.urandom(2).hex()}"
        actor: Any = (  # an actor handle: its methods' `.remote` are made at run time
            ray.remote(num_cpus=0)(PoolActor)
            .options(
                namespace=NAMESPACE,
                max_concurrency=64,
                name=pool_id,
                scheduling_strategy=cluster.on_this_node(),
                runtime_env=remote.with_job_env(spec.get("runtime_env") or {}),  # its jobs' (its key says so)
            )
            .remote(
                pool_id, spec["backend"], spec["num_workers"], spec["per_worker"], spec["use_gpu"], spec.get("imports")
            )
        )
        actor.start.remote()
        self.actors[pool_id] = actor
        self.watched.watch(actor.wait_ended.remote(), lambda ref: self._ended(pool_id, ref))
        self.watched.watch(actor.wait_ready.remote(), lambda ref: self._ready(pool_id, ref))
        now = time.time()
        self.pools[pool_id] = PoolRecord(
            id=pool_id,
            key=spec["key"],
            backend=_kind(spec),
            num_workers=spec["num_workers"],
            needs=dict(needs),
            state="starting" if job_id else "idle",
            warm=spec["key"] in self.warm_pools,
            started=now,
            idle_since=None if job_id else now,
            job=job_id,
        )
        self.book.changed.notify_all()
        return pool_id

    def _start_warm(self, check_room: bool = True) -> list[str]:
        """Start each warm pool that is not running (of one kind, one at a time: ``_behind``). With
        ``check_room``: only once the server has had no job and the cluster room for them, with nothing
        waiting for resources, at two looks ``_REWARM_S`` apart (so not in a gap between another's tasks
        or trials)."""
        running = {p.key for p in self.pools.values()}
        missing = [k for k in self.warm_pools if k not in running and not self._behind(k)]
        if not missing or self.draining:
            return []
        if check_room and time.monotonic() - self._warmed < _REWARM_S:
            return []
        available = {k: float(v) for k, v in ray.available_resources().items()}
        if check_room:
            self._warmed = time.monotonic()  # looked at (Ray's demand asked) once per _REWARM_S at most
            total: dict[str, float] = {}
            for key in missing:
                for name, amount in self.warm_pools[key][1].items():
                    total[name] = total.get(name, 0.0) + amount
            room = not self.book.active() and fits(total, available) is None and not pending_demand()
            seen, self._room_seen = self._room_seen, room
            if not (room and seen):
                return []
        started = []
        for key in missing:
            spec, needs = self.warm_pools[key]
            if check_room and fits(needs, available) is not None:
                continue
            available = {k: available.get(k, 0.0) - needs.get(k, 0.0) for k in set(available) | set(needs)}
            started.append(self._new_warm(key))
        self._warmed = time.monotonic()
        return started

    def _new_warm(self, key: str) -> str:
        spec, needs = self.warm_pools[key]
        pool_id = self._new_pool(spec, needs, job_id=None)
        print(f"warming pool {pool_id} of {spec['num_workers']} {_kind(spec)} worker(s)", flush=True)
        return pool_id

    def _behind(self, key: str) -> bool:
        """Whether the warm pool ``key`` waits for one of its kind named before it (``torch:2,torch:1``) that
        is not running or still starting: pools of one kind start one after another, in the order given,
        so that a first job of that kind, most likely of the first size, does not share the CPUs with the
        second's start. It starts when that one is ready (``_ready``)."""
        kind = _kind(self.warm_pools[key][0])
        for earlier, (spec, _) in self.warm_pools.items():
            if earlier == key:
                return False
            if _kind(spec) == kind and not any(
                p.key == earlier and p.ready and p.state != "ending" for p in self.pools.values()
            ):
                return True
        return False

    def _start_behind(self, key: str) -> None:
        """The pool of warm key ``key`` is ready: start the next warm pool of its kind (``_behind``), where
        the cluster has room for it now; otherwise it starts once it has (``rewarm``)."""
        if self.draining or key not in self.warm_pools:
            return
        kind, running = _kind(self.warm_pools[key][0]), {p.key for p in self.pools.values()}
        available = {k: float(v) for k, v in ray.available_resources().items()}
        for later, (spec, needs) in self.warm_pools.items():
            if _kind(spec) != kind or later in running or self._behind(later):
                continue
            if fits(needs, available) is None:
                self._new_warm(later)
                return

    def _ready(self, pool_id: str, ref: Any) -> None:
        """The pool's ``wait_ready`` answered: ``True`` once every worker has started and asked for a job."""
        try:
            ready = bool(ray.get(ref))
        except Exception:  # noqa: BLE001 - its process died: `_ended` says so
            ready = False
        with self.book.changed:
            pool = self.pools.get(pool_id)
            if pool is not None and ready:
                pool.ready = True
                print(f"pool {pool_id} ready in {time.time() - pool.started:.1f} s", flush=True)
                self._start_behind(pool.key)
                self.book.changed.notify_all()

    # ------------------------------------------------------------ ends
    def end(self, pool_id: str, why: str, force: bool = False) -> None:
        """End a pool: gracefully (its idle workers return, Ray Train releases their resources), or with
        ``force`` (a pool whose workers cannot return): its actor is killed, and its Train controller and
        workers with it (a worker group it was placing can outlive them: ``Recovery.sweep`` looks for it)."""
        pool = self.pools.get(pool_id)
        if pool is None or (pool.state == "ending" and not force):
            return
        if not pool.ready and pool.job is None:
            force = True  # a warm pool still starting: its workers would finish starting only to leave
        pool.state, pool.ended_because, pool.ending_since = "ending", why, time.time()
        if force:
            ray.kill(self.actors[pool_id])
        else:
            self.actors[pool_id].end.remote()
        self.book.changed.notify_all()

    def expire(self) -> None:
        """Idle pools past ``idle_s``, and idle pools whose resources something else waits for."""
        now = time.time()
        with self.book.lock:
            for pool in list(self.pools.values()):
                if pool.state == "ending" and now - (pool.ending_since or now) > _END_S:
                    self.end(pool.id, f"it did not end within {_END_S:g} s", force=True)
            for pool in self.idle():
                if not pool.warm and now - (pool.idle_since or now) >= self.idle_s:
                    self.end(pool.id, f"idle for {self.idle_s:g} s")
            idle = self.idle()
        if idle and time.monotonic() - self._demand_checked >= 1.0:
            self._demand_checked = time.monotonic()
            demands = pending_demand()
            if not demands:
                return
            with self.book.lock:
                available = {k: float(v) for k, v in ray.available_resources().items()}
                for pool in idle:
                    if pool.state != "idle":
                        continue
                    room = {k: available.get(k, 0.0) + pool.needs.get(k, 0.0) for k in set(available) | set(pool.needs)}
                    if any(fits(bundle, room) is None for bundle in demands):
                        self.end(pool.id, "other work waits for its resources")

    def rewarm(self) -> None:
        if self.warm_pools:
            with self.book.lock:
                self._start_warm()

    def _ended(self, pool_id: str, ref: Any) -> None:
        try:
            why = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the pool's process died
            why = f"its process died: {exc}"
        with self.book.changed:
            pool = self.pools.pop(pool_id, None)
            actor = self.actors.pop(pool_id, None)
            if pool is not None and pool.warm:
                self._warmed, self._room_seen = time.monotonic(), False  # looked at again in _REWARM_S
            self.book.changed.notify_all()
        if actor is not None and pool is not None and pool.state == "busy":
            # Its job's `run_job` returns the pool's reason within a moment: killed now, the job would
            # only learn that the actor was killed.
            threading.Timer(_END_S / 4, ray.kill, [actor]).start()
        elif actor is not None:
            ray.kill(actor)
        # Why the server ended it ("idle for 120 s", "other work waits for its resources", ...), if it did: a
        # pool that ends when nobody asked it to (its run failed, its process died) says what ended it.
        because = pool.ended_because if pool is not None else None
        print(f"pool {pool_id} ended: {because if because and why == 'ended' else why}", flush=True)


_COORDINATOR_ASKED = threading.Event()


def _coordinator_ahead() -> None:
    """Ask for Ray Data's autoscaling coordinator, once per server, as its first pool starts.

    The controller of a Ray Train V2 run makes it (a detached actor, once per Ray instance, on the
    controller's node: this one) and waits for it while it is constructed: a process that imports Ray
    Data, 1-2 s on the critical path of the first pool of a Ray instance, after the pool's actor and
    the controller's own start. Asked for here, it starts beside them, and the controller finds it made.
    Ray's own function makes it, with Ray's own name and options; where it cannot, the controller does."""
    if _COORDINATOR_ASKED.is_set():
        return
    _COORDINATOR_ASKED.set()

    def make() -> None:
        try:
            from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
                get_or_create_autoscaling_coordinator,
            )

            get_or_create_autoscaling_coordinator()
        except Exception:  # noqa: BLE001 - the run's controller makes it, as without this
            pass

    threading.Thread(target=make, name="raymodel-autoscaling-coordinator", daemon=True).start()


def _demand() -> Any:
    from ray.autoscaler.v2.sdk import get_cluster_status

    return get_cluster_status(ray.get_runtime_context().gcs_address).resource_demands


def _bundles(demands: list[Any]) -> list[dict[str, float]]:
    return [
        {k: float(v) for k, v in b.bundle.items()}
        for d in demands
        for b in d.bundles_by_count
        for _ in range(max(int(b.count), 1))
    ]


def pending_demand() -> list[dict[str, float]]:
    """The resource bundles Ray reports that tasks, actors and placement groups wait for (one entry
    per bundle)."""
    try:
        demand = _demand()
    except Exception:  # noqa: BLE001 - no demand known is no reason to release anything
        return []
    return _bundles([*demand.placement_group_demand, *demand.ray_task_actor_demand])


def pending_groups() -> list[tuple[list[dict[str, float]], int]]:
    """The placement groups (worker groups) Ray cannot place now: for each, the bundles that wait
    and how many bundles the group has. A group that lost a node (RESCHEDULING) waits only for the
    bundles it lost, so its size comes from Ray's placement group table."""
    try:
        groups = _demand().placement_group_demand
    except Exception:  # noqa: BLE001 - nothing known to wait
        return []
    table = ray.util.placement_group_table() if groups else {}
    out = []
    for group in groups:
        waiting = _bundles([group])
        size = len(table.get(group.pg_id or "", {}).get("bundles") or {}) or len(waiting)
        out.append((waiting, max(size, len(waiting))))
    return out


def _kind(spec: dict[str, Any]) -> str:
    """The pool's kind (``jobs/_request.py``'s ``pool_kind``); a job recorded before kinds: its backend's name."""
    return spec.get("kind") or spec["backend_name"]
