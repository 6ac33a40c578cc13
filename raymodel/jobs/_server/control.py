"""``JobControl``: the training server's part that changes running jobs and watches what they wait for.

* ``update``: ``job.update(config=..., settings=...)``, checked here and recorded;
  each change reaches the job's workers through ``control``, which rank 0 calls at
  every epoch's end (and once before the first), so that every worker applies it
  at the same epoch boundary.
* ``control`` also tells a job to stop, or that it is preempted.
* ``worker_lost``: a job's workers failed (Ray Train restarts them). Until a row
  comes again the server watches for a worker group Ray cannot place and says in
  the job's ``reason`` what it waits for; past ``resource_wait_s`` the job fails.
"""

from __future__ import annotations

import json
import time
from typing import Any

import ray

from raymodel.jobs._constants import UPDATABLE
from raymodel.jobs._pools.keeper import PoolKeeper, pending_groups
from raymodel.jobs._server.book import JobBook
from raymodel.jobs._server.queue import fits
from raymodel.jobs._server.records import JobRecord, Lost
from raymodel.jobs._server.runner import Runners

#: How long after a failure the server starts to look for a worker group Ray cannot place.
_PLACE_GRACE_S = 2.0


class JobControl:
    """Changes, stops and watches the book's running jobs (their pools: ``PoolKeeper``; their runners:
    ``Runners``)."""

    def __init__(self, book: JobBook, pools: PoolKeeper, runners: Runners) -> None:
        self.book, self.pools, self.runners = book, pools, runners
        self.alive_nodes: set[str] = set()
        self.lost_nodes: dict[str, float] = {}  # node id -> when it was seen dead
        self._nodes_checked = 0.0

    # ------------------------------------------------------------ clients
    def stop(self, job_id: str) -> str:
        with self.book.lock:
            record = self.book.records.get(job_id)
            if record is None:
                return "missing"
            if record.status == "PENDING":
                self.book.finish(job_id, "STOPPED", result=None)
            elif record.status == "RUNNING" and (record.lost or record.reason):
                # It waits for lost resources: no epoch will end for it to stop at.
                record.stopping = record.stop_now = True
                self.book.log(job_id, "stop requested while it waits: it ends now, with its newest checkpoint")
                self.abandon(record)
            elif record.status == "RUNNING" and not record.stopping:
                record.stopping = True
                self.book.log(job_id, "stop requested: the current epoch ends, a checkpoint is written")
                self.book.save(job_id)
                self.runners.stop(job_id)
            return record.status

    def stop_trial(self, trial_id: str) -> None:
        """Stop the jobs a Tune trial submitted (the trial ended)."""
        with self.book.lock:
            ids = [r.id for r in self.book.active() if r.trial_id == trial_id]
        for job_id in ids:
            self.stop(job_id)

    def stopping(self, job_id: str) -> bool:
        """Whether the job was asked to stop (its workers ask at each epoch's end)."""
        with self.book.lock:
            record = self.book.records.get(job_id)
            return record is not None and record.stopping

    def update(self, job_id: str, config: dict[str, Any] | None, settings: dict[str, Any] | None) -> dict[str, Any]:
        """Record a change for the job's next epoch boundary: ``{"change": ...}``, or ``{"error": ...}``
        (the job untouched)."""
        with self.book.lock:
            record = self.book.records.get(job_id)
            if record is None:
                return {"error": f"No job `{job_id}` on this cluster's raymodel server."}
            problem = _check_update(record, dict(config or {}), dict(settings or {}))
            if problem:
                return {"error": problem}
            config, settings = dict(config or {}), dict(settings or {})
            change = {"requested": time.time(), "config": config, "settings": settings, "epoch": None}
            record.changes.append(change)
            if "num_epochs" in settings:
                record.epochs = int(settings["num_epochs"])
            shown = ", ".join(f"{k}={v!r}" for k, v in {**config, **settings}.items())
            self.book.log(job_id, f"update requested: {shown} (from the next epoch boundary)")
            self.book.save(job_id)
            self.book.changed.notify_all()
            return {"change": change}

    # ------------------------------------------------------------ workers
    def control(self, job_id: str, epoch: int, known: int) -> dict[str, Any]:
        """Rank 0 at the end of ``epoch`` (0: before the first): ``stop``, ``preempt`` (by whom), and the
        changes after the first ``known`` (each takes effect from ``epoch + 1``)."""
        with self.book.lock:
            record = self.book.records.get(job_id)
            if record is None:
                return {}
            answer: dict[str, Any] = {}
            if record.stopping:
                answer["stop"] = True
            if record.preempting:
                answer.update(stop=True, preempt=record.preempting)
            new = record.changes[known:]
            if new:
                for change in new:
                    if change.get("epoch") != epoch + 1:
                        change["epoch"] = epoch + 1
                        self.book.log(job_id, f"update takes effect from epoch {epoch + 1}")
                self.book.save(job_id)
                answer["changes"] = [{k: c[k] for k in ("epoch", "config", "settings")} for c in new]
            return answer

    def restored(self, job_id: str, history: list[dict[str, Any]]) -> None:
        """The job resumed from a checkpoint with this history: its rows are those, then the new ones
        (a row Ray Train had not passed on before a failure is added; an epoch run again is not doubled)."""
        with self.book.lock:
            record = self.book.records.get(job_id)
            if record is None:
                return
            if [r.get("epoch") for r in record.history] != [r.get("epoch") for r in history]:
                record.history = [record.tagged(dict(r)) for r in history]
                times = self.book.row_times.get(job_id, [])
                self.book.row_times[job_id] = times[: len(history)]
                self.book.save(job_id)
                self.book.changed.notify_all()

    def done_computing(self, job_id: str) -> None:
        """A release passed its gate: what is left (registering, its rollout) holds no workers, so the
        resources it was scheduled with go to the queue's next jobs."""
        with self.book.lock:
            record = self.book.records.get(job_id)
            if record is not None and record.needs:
                record.needs = {}
                self.book.log(job_id, "trained and scored: it holds no workers from here")
                self.book.save(job_id)

    def worker_lost(self, job_id: str, errors: dict[int, str]) -> None:
        """Ray Train saw the job's workers fail and restarts them (a pool's or a one-off run's)."""
        with self.book.lock:
            record = self.book.records.get(job_id)
            if record is None or record.status != "RUNNING":
                return
            epoch = record.last_epoch
            nodes = [n for n, when in self.lost_nodes.items() if time.time() - when < 30]
            record.lost = Lost(at=time.time(), epoch=epoch, rows=len(record.history), nodes=nodes)
            rank, error = sorted(errors.items())[0] if errors else (0, "?")
            self.book.log(job_id, f"worker {rank} failed after epoch {epoch} ({error}); Ray Train restarts the workers")
            self.book.save(job_id)

    # ----------------------------------------------------------- the loop
    def watch_waits(self) -> None:
        """Each second: nodes that died; for each job whose workers failed, whether Ray can place them
        again (else the reason says what is missing), and whether it waited past ``resource_wait_s``."""
        now = time.time()
        if now - self._nodes_checked < 1.0:
            return
        self._nodes_checked = now
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        for node in self.alive_nodes - alive:
            self.lost_nodes[node] = now
        self.alive_nodes = alive
        with self.book.lock:
            waiting = [r for r in self.book.running() if r.lost]
            for record in waiting:
                seen = record.lost
                assert seen is not None
                recent = {n for n, t in self.lost_nodes.items() if t >= seen.at - 30}
                seen.nodes = sorted(set(seen.nodes) | recent)
                if len(record.history) > seen.rows:
                    record.lost, record.reason = None, None
                    self.book.log(record.id, "resumed")
                    self.book.save(record.id)
        if not waiting or all(now - r.lost.at < _PLACE_GRACE_S for r in waiting if r.lost):
            return
        missing = _unplaced(pending_groups())
        with self.book.lock:
            for record in waiting:
                lost = record.lost
                if lost is None or now - lost.at < _PLACE_GRACE_S:
                    continue
                if not missing:
                    if record.reason:
                        record.reason = None
                    continue
                where = (
                    f"node {', '.join(n[:12] for n in lost.nodes)} lost at epoch {lost.epoch}"
                    if lost.nodes
                    else f"its workers failed after epoch {lost.epoch}"
                )
                reason = f"waiting for {missing}: {where}"
                if record.reason != reason:
                    record.reason = reason
                    self.book.log(record.id, reason)
                    self.book.save(record.id)
                    self.book.changed.notify_all()
                wait_s = record.resource_wait_s
                if wait_s is not None and now - lost.at > wait_s:
                    self._give_up(
                        record,
                        f"Waited {wait_s:g} s for {missing} ({where}). Add the resources, or raise "
                        "`TrainSettings.resource_wait_s`.",
                    )

    def _give_up(self, record: JobRecord, error: str) -> None:
        """End a job that cannot get its resources back: its pool (or runner) is killed; the server
        reports ``error`` when its run ends."""
        record.fail_with = error
        self.abandon(record, "its job waited too long for lost resources")
        record.lost = None

    def abandon(self, record: JobRecord, why: str = "") -> None:
        """End a running job's run at once (its pool, or its runner, is killed); its run's end ends the job.

        A run that waits for lost resources has a worker group waiting to be placed, and Ray keeps that
        placement group after its Train controller is killed (Ray Train's cleaner only knows the groups
        of started workers): it would take the resources once they return. ``Recovery.sweep`` removes it
        once Ray knows its creator is dead."""
        if record.pool_id and record.pool_id in self.pools.pools:
            self.pools.end(record.pool_id, why or f"{record.id} ends now", force=True)
        else:
            self.runners.kill(record.id)


def _unplaced(groups: list[tuple[list[dict[str, float]], int]]) -> str | None:
    """What Ray's waiting worker groups lack, in words ("1 more CPU for 1 worker of 2"), from the
    bundles that do not fit what is free now (``None``: nothing is waiting). ``groups``: each waiting
    group's unplaced bundles and its size (``pending_groups``)."""
    if not groups:
        return None
    free = {k: float(v) for k, v in ray.available_resources().items()}
    short: dict[str, float] = {}
    workers = 0
    for bundle in (b for bundles, _ in groups for b in bundles):
        if fits(bundle, free) is None:
            free = {k: free.get(k, 0.0) - bundle.get(k, 0.0) for k in free}
            continue
        workers += 1
        for k, v in bundle.items():
            short[k] = short.get(k, 0.0) + max(v - max(free.get(k, 0.0), 0.0), 0.0)
            free[k] = max(free.get(k, 0.0) - v, 0.0)
    if not workers:
        return None
    amounts = ", ".join(f"{v:g} more {k}" for k, v in sorted(short.items()) if v > 0) or "resources"
    size = sum(size for _, size in groups)
    return f"{amounts} for {workers} worker{'s' if workers != 1 else ''} of {size}"


def _check_update(record: JobRecord, config: dict[str, Any], settings: dict[str, Any]) -> str | None:
    """Why this change is not allowed, or ``None``."""
    job = f"Job `{record.id}`"
    if not record.active:
        return f"{job} is {record.status}: a finished job cannot change (train again, with `resume_from`)."
    if record.kind != "train":
        return f"{job} is a {record.kind} job: change its trials' settings in the search space instead."
    if not config and not settings:
        return "Nothing to change: pass `config={...}` and/or `settings={...}`."
    unknown = sorted(set(settings) - set(UPDATABLE))
    if unknown:
        return (
            f"Cannot change {', '.join(f'`{k}`' for k in unknown)} of a running job; "
            f"the settings that may change are {', '.join(f'`{k}`' for k in UPDATABLE)}."
        )
    done = record.last_epoch
    if "num_epochs" in settings:
        value = settings["num_epochs"]
        if not _is_int(value) or value < 1:
            return f"`num_epochs` must be an int >= 1 (got {value!r})."
        if value < done:
            return f"`num_epochs={value}` is below the {done} epoch(s) {job} has done; it can only end from now on."
    every = settings.get("checkpoint_every", 1)
    if not _is_int(every) or every < 1:
        return f"`checkpoint_every` must be an int >= 1 (got {every!r})."
    if "keep_checkpoints" in settings:
        value = settings["keep_checkpoints"]
        if value is not None and (not _is_int(value) or value < 1):
            return f"`keep_checkpoints` must be an int >= 1 or None (got {value!r})."
        if not record.pool_key:
            return (
                f"`keep_checkpoints` of {job} is Ray Train's, fixed when its run started (a run with "
                "`pool=False` or an elastic one); jobs on a pool can change it."
            )
    bad = [k for k in config if not isinstance(k, str)]
    if bad:
        return f"Config keys must be strings (got {bad[0]!r})."
    try:
        json.dumps(config)
    except (TypeError, ValueError) as exc:
        return f"Config values must be plain data (numbers, strings, lists, dicts): {exc}."
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
