"""``Scheduler``: the training server's part that starts jobs: the queue by priority, preemption, ETAs.

The policy itself (order, whom to preempt, when each job is expected to start)
is plain functions of the job records in ``jobs/_server/queue.py``; this part applies
it to the book's jobs: free resources, idle pools, runners.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import ray

from raymodel.jobs._pools.keeper import PoolKeeper
from raymodel.jobs._server.book import JobBook
from raymodel.jobs._server.queue import choose_victims, etas, fits, plus, queue_order
from raymodel.jobs._server.records import JobRecord
from raymodel.jobs._server.runner import Runners
from raymodel.jobs._server.watched import Watched

#: Who a job gives way to when the head is stopped (its record's ``preempted_by``).
DRAIN = "`raymodel server stop`"


class Scheduler:
    """Starts the book's PENDING jobs on the pools (``PoolKeeper``) and runners (``Runners``); each run's
    end goes to ``on_end(job_id, ref)`` (the server's)."""

    def __init__(
        self,
        book: JobBook,
        pools: PoolKeeper,
        runners: Runners,
        watched: Watched,
        on_end: Callable[[str, Any], None],
    ) -> None:
        self.book, self.pools, self.runners, self.watched, self.on_end = book, pools, runners, watched, on_end
        self.draining = False  # the head is going down (`raymodel server stop`): no job starts

    def free(self) -> dict[str, float]:
        """What new work may take now: free in Ray, less what started work holds or is about to."""
        total = {k: float(v) for k, v in ray.cluster_resources().items()}
        available = {k: float(v) for k, v in ray.available_resources().items()}
        held: dict[str, float] = {}
        committed = [r.needs for r in self.book.running() if not r.pool_id]
        committed += [p.needs for p in self.pools.pools.values()]  # a pool holds its share, busy or not
        for needs in committed:  # started work whose workers may not hold their share yet
            held = plus(held, needs)
        return {k: min(available.get(k, 0.0), total[k] - held.get(k, 0.0)) for k in total}

    def etas(self) -> dict[str, float | None]:
        free = self.free()
        for pool in self.pools.pools.values():
            if pool.state in ("idle", "ending"):
                free = plus(free, pool.needs)
        return etas(self.book.active(), free, lambda i: self.book.row_times.get(i, []), time.time())

    def drain(self) -> list[str]:
        """The head is going down (``raymodel server stop``): no job starts from now, and each running
        training job ends its epoch, writes a checkpoint and waits PENDING, as a preempted job does,
        so that the next head on this storage resumes it from there. Returns the jobs asked."""
        with self.book.lock:
            self.draining = self.pools.draining = True
            asked = []
            for record in self.book.running():
                if record.kind != "train" or record.trial_id:
                    continue  # a tune job's trials resume with the experiment (Tune's own restore)
                if not record.preempting and not record.stopping:
                    record.preempting = DRAIN
                    self.book.log(record.id, "the server stops: the current epoch ends, a checkpoint is written")
                    self.book.save(record.id)
                asked.append(record.id)
            self.book.changed.notify_all()
            return asked

    def schedule(self) -> None:
        with self.book.lock:
            if self.draining:
                return
            pending = queue_order(self.book.records.values())
            if not pending:
                return
            free = self.free()
            for record in pending:
                key = record.pool_key
                idle = self.pools.idle(key) if key else []
                if idle:
                    self._launch(record, idle[0].id)
                    continue
                reason = fits(record.needs, free)
                if reason is None:
                    free = plus(free, record.needs, -1.0)
                    self._launch(record, self.pools.start_for(record) if key else None)
                    continue
                others = [p for p in self.pools.pools.values() if p.state in ("idle", "ending")]
                freed = dict(free)
                for pool in others:
                    freed = plus(freed, pool.needs)
                if others and fits(record.needs, freed) is None:
                    for pool in others:
                        self.pools.end(pool.id, f"its resources are needed by {record.id}")
                    record.reason = "waiting for idle pools to end"
                    break
                running = self.book.running()
                victims, enough = choose_victims(record, running, freed)
                going = [r.id for r in running if r.preempting]
                if enough and (victims or going):
                    for victim in victims:
                        self._preempt(victim, record)
                    ids = ", ".join(going + [v.id for v in victims])
                    record.reason = f"waiting for {ids} to checkpoint and end (preempted)"
                else:
                    before = f"preempted by {record.preempted_by}; " if record.preempted_by else ""
                    record.reason = before + reason
                break  # first in, first out: a small job does not overtake a waiting big one

    def _preempt(self, victim: JobRecord, by: JobRecord) -> None:
        """Ask a running job to end its epoch, write a checkpoint and give its workers back (it waits
        PENDING and resumes from that checkpoint); ``JobControl.control`` tells its workers."""
        victim.preempting = by.id
        self.book.log(
            victim.id,
            f"preempted by {by.id} (priority {by.priority}): the current epoch ends, a checkpoint is written",
        )
        self.book.log(by.id, f"preempts {victim.id} (priority {victim.priority})")
        self.book.save(victim.id)

    def _launch(self, record: JobRecord, pool_id: str | None = None) -> None:
        job_id = record.id
        pool = None
        record.pool_id = None
        if pool_id is not None:
            pool = self.pools.take(pool_id, job_id)
            record.pool_id = pool_id
        extras = self.book.extras.get(job_id, {})
        ref = self.runners.start(
            job_id,
            record.runtime_env,  # a runner of the job's runtime env, its own
            record.kind,
            self.book.payloads[job_id],  # kept until the job ends: a preempted job starts again from it
            pool,
            extras.get("hub"),
            record.model_class,
            extras.get("datasets"),
            extras.get("refs"),
            record.resume,
        )
        self.watched.watch(ref, lambda ref: self.on_end(job_id, ref))
        record.status, record.reason, record.started = "RUNNING", None, time.time()
        self.book.row_times.pop(job_id, None)
        again = " again, from its newest checkpoint" if record.preempted_by or record.resume else ""
        self.book.log(job_id, "started" + (f" on pool {pool_id}" if pool_id else "") + again)
        warming = self.pools.pools[pool_id] if pool_id is not None else None
        if warming is not None and warming.warm and not warming.ready and not warming.jobs_run:
            self.book.log(job_id, f"taking warm pool {pool_id} of {warming.num_workers} {warming.backend} worker(s)")
        self.book.save(job_id)
        self.book.changed.notify_all()

    def requeue(self, record: JobRecord) -> None:
        """A preempted job wrote its checkpoint and gave its workers back: it waits again."""
        by, record.preempting = record.preempting, None
        record.status, record.reason, record.preempted_by = "PENDING", f"preempted by {by}", by
        record.preemptions += 1
        self.book.log(
            record.id, f"preempted by {by} after epoch {record.last_epoch}; waits, and resumes from that checkpoint"
        )
        self.book.save(record.id)
        self.book.changed.notify_all()
