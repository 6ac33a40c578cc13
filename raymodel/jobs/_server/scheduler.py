"""``Scheduler``: the training server's part that starts jobs: the queue by priority, preemption, ETAs.

The policy itself (order, whom to preempt, when each job is expected to start)
is plain functions of the job records in ``jobs/_server/queue.py``; this part applies
it to the server's state: free resources, idle pools, runners.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from raymodel.jobs._constants import ACTIVE
from raymodel.jobs._server.queue import choose_victims, etas, fits, plus, queue_order
from raymodel.jobs._server.runner import new_runner
from raymodel.jobs._server.state import ServerState

#: Who a job gives way to when the head is stopped (its record's ``preempted_by``).
DRAIN = "`raymodel server stop`"


class Scheduler(ServerState):
    """Mixed into ``JobServer`` (its state: ``ServerState``)."""

    def _free(self) -> dict[str, float]:
        """What new work may take now: free in Ray, less what started work holds or is about to."""
        total = {k: float(v) for k, v in ray.cluster_resources().items()}
        available = {k: float(v) for k, v in ray.available_resources().items()}
        held: dict[str, float] = {}
        committed = [r["needs"] for r in self.records.values() if r["status"] == "RUNNING" and not r.get("pool_id")]
        committed += [p["needs"] for p in self.pools.values()]  # a pool holds its share, busy or not
        for needs in committed:  # started work whose workers may not hold their share yet
            held = plus(held, needs)
        return {k: min(available.get(k, 0.0), total[k] - held.get(k, 0.0)) for k in total}

    def _etas(self) -> dict[str, float | None]:
        free = self._free()
        for pool in self.pools.values():
            if pool["state"] in ("idle", "ending"):
                free = plus(free, pool["needs"])
        active = [r for r in self.records.values() if r["status"] in ACTIVE]
        return etas(active, free, lambda i: self.row_times.get(i, []), time.time())

    def drain(self) -> list[str]:
        """The head is going down (``raymodel server stop``): no job starts from now, and each running
        training job ends its epoch, writes a checkpoint and waits PENDING, as a preempted job does,
        so that the next head on this storage resumes it from there. Returns the jobs asked."""
        with self.lock:
            self.draining = True
            asked = []
            for record in self.records.values():
                if record["status"] != "RUNNING" or record["kind"] != "train" or record.get("trial_id"):
                    continue  # a tune job's trials resume with the experiment (Tune's own restore)
                if not record.get("preempt_by") and not record.get("stopping"):
                    record["preempt_by"] = DRAIN
                    self._log(record["id"], "the server stops: the current epoch ends, a checkpoint is written")
                    self._save(record["id"])
                asked.append(record["id"])
            self.changed.notify_all()
            return asked

    def _schedule(self) -> None:
        with self.lock:
            if self.draining:
                return
            pending = queue_order(self.records.values())
            if not pending:
                return
            free = self._free()
            for record in pending:
                key = record.get("pool_key")
                idle = [p for p in self.pools.values() if p["state"] == "idle" and p["key"] == key] if key else []
                if idle:
                    self._launch(record, idle[0]["id"])
                    continue
                reason = fits(record["needs"], free)
                if reason is None:
                    free = plus(free, record["needs"], -1.0)
                    self._launch(record, self._start_pool(record) if key else None)
                    continue
                others = [p for p in self.pools.values() if p["state"] in ("idle", "ending")]
                freed = dict(free)
                for pool in others:
                    freed = plus(freed, pool["needs"])
                if others and fits(record["needs"], freed) is None:
                    for pool in others:
                        self._end_pool(pool["id"], f"its resources are needed by {record['id']}")
                    record["reason"] = "waiting for idle pools to end"
                    break
                running = [r for r in self.records.values() if r["status"] == "RUNNING"]
                victims, enough = choose_victims(record, running, freed)
                going = [r["id"] for r in running if r.get("preempt_by")]
                if enough and (victims or going):
                    for victim in victims:
                        self._preempt(victim, record)
                    ids = ", ".join(going + [v["id"] for v in victims])
                    record["reason"] = f"waiting for {ids} to checkpoint and end (preempted)"
                else:
                    before = f"preempted by {record['preempted_by']}; " if record.get("preempted_by") else ""
                    record["reason"] = before + reason
                break  # first in, first out: a small job does not overtake a waiting big one

    def _preempt(self, victim: dict[str, Any], by: dict[str, Any]) -> None:
        """Ask a running job to end its epoch, write a checkpoint and give its workers back (it waits
        PENDING and resumes from that checkpoint); ``control`` tells its workers."""
        victim["preempt_by"] = by["id"]
        self._log(
            victim["id"],
            f"preempted by {by['id']} (priority {by.get('priority', 0)}): "
            "the current epoch ends, a checkpoint is written",
        )
        self._log(by["id"], f"preempts {victim['id']} (priority {victim.get('priority', 0)})")
        self._save(victim["id"])

    def _launch(self, record: dict[str, Any], pool_id: str | None = None) -> None:
        job_id = record["id"]
        if record.get("runtime_env"):  # a runner of the job's runtime env, its own
            runner = new_runner(self.warm_imports(), runtime_env=record["runtime_env"])
        else:
            runner, self.spare = self.spare or new_runner(self.warm_imports(), self.warm_runs), None  # imports done
        self.runners[job_id] = runner
        pool = None
        record.pop("pool_id", None)
        if pool_id is not None:
            pool = self.pool_actors[pool_id]
            self.pools[pool_id].update(state="busy", job=job_id, idle_since=None)
            record["pool_id"] = pool_id
        extras = self.extras.get(job_id, {})
        ref = runner.run.remote(
            job_id,
            record["kind"],
            self.payloads[job_id],  # kept until the job ends: a preempted job starts again from it
            pool,
            extras.get("hub"),
            record["model_class"],
            extras.get("datasets"),
            extras.get("refs"),
            bool(record.get("resume")),
        )
        self.watch(self.done_refs, ref, job_id)
        record.update(status="RUNNING", reason=None, started=time.time())
        self.row_times.pop(job_id, None)
        again = " again, from its newest checkpoint" if record.get("preempted_by") or record.get("resume") else ""
        self._log(job_id, "started" + (f" on pool {pool_id}" if pool_id else "") + again)
        warming = self.pools[pool_id] if pool_id is not None else {}
        if warming.get("warm") and not warming.get("ready") and not warming.get("jobs_run"):
            self._log(job_id, f"taking warm pool {pool_id} of {warming['num_workers']} {warming['backend']} worker(s)")
        self._save(job_id)
        self.changed.notify_all()

    def _requeue(self, record: dict[str, Any]) -> None:
        """A preempted job wrote its checkpoint and gave its workers back: it waits again."""
        by = record.pop("preempt_by")
        record.update(status="PENDING", reason=f"preempted by {by}", preempted_by=by)
        record["preemptions"] = record.get("preemptions", 0) + 1
        epoch = max((int(r.get("epoch", 0)) for r in record["history"]), default=0)
        self._log(record["id"], f"preempted by {by} after epoch {epoch}; waits, and resumes from that checkpoint")
        self._save(record["id"])
        self.changed.notify_all()
