"""The training server: a named Ray actor that owns the job records and runs each job.

Each job runs in its own ``JobRunner`` actor (no resources of its own; the run's workers or trials hold them).
A training job runs on a pool (a resident worker group, ``jobs/_pools/pool.py``) that fits what its workers
need: an idle one, or a new one when the cluster's free resources allow; ``pool=False`` jobs and tune jobs
call the blocking verb (``Trainable.fit`` or ``Tunable.fit``) as ``model.train()`` and ``model.tune()`` do.
Either way every epoch row reaches the server.

The server is made of parts, each with its own state, which it composes and calls through their methods:
``JobBook`` (the records, their payloads, the one lock), ``Scheduler`` (a PENDING job waits, by priority
then first in first out, with the reason; a job that cannot fit preempts running jobs of lower priority),
``PoolKeeper`` (an idle pool ends after ``pool_idle_s``, at once when a job or anything else needs its
resources, or on ``release_pools``), ``Runners`` (a runner actor per running job, and a spare),
``JobControl`` (running jobs changed, stopped and watched) and ``Recovery`` (restarts and disk).
``docs/architecture.md`` draws who calls whom.

Durable: every record and payload is in storage (``jobs/_store.py``) before
``submit`` answers. The actor restarts by itself when it dies (Ray's actor
restarts; its runners and pools die with it), and a new head with the same
storage starts it again (``raymodel server start``): either way ``Recovery.recover``
keeps every PENDING job in its place and queues every RUNNING one again, to
resume from its newest checkpoint. The server also prunes what it leaves on
disk (``jobs/_prune.py``).
"""

from __future__ import annotations

import builtins  # `list` in the class is the clients' call
import os
import threading
import time
import traceback
from typing import Any

import ray

from raymodel.jobs import _store
from raymodel.jobs._constants import DEFAULT_POOL_IDLE_S
from raymodel.jobs._from_registry import register_result
from raymodel.jobs._pools.keeper import PoolKeeper
from raymodel.jobs._release_plan import describe
from raymodel.jobs._server.book import JobBook
from raymodel.jobs._server.control import JobControl
from raymodel.jobs._server.queue import fits
from raymodel.jobs._server.records import JobRecord
from raymodel.jobs._server.recovery import Recovery, stored_result
from raymodel.jobs._server.runner import Runners
from raymodel.jobs._server.scheduler import Scheduler
from raymodel.jobs._server.watched import Watched


class JobServer:
    """The training server: its clients' calls, each answered by the part it concerns; its loop."""

    def __init__(
        self, home: str, pool_idle_s: float = DEFAULT_POOL_IDLE_S, limits: dict[str, float] | None = None
    ) -> None:
        os.environ["RAYMODEL_HOME"] = home  # records and runs go where the first client's home is
        self.book = JobBook()
        self.watched = Watched()
        self.runners = Runners()
        self.pools = PoolKeeper(self.book, self.watched, pool_idle_s)
        self.scheduler = Scheduler(self.book, self.pools, self.runners, self.watched, self._run_ended)
        self.jobs = JobControl(self.book, self.pools, self.runners)
        self.recovery = Recovery(self.book, limits)
        with self.book.lock:
            self.recovery.recover()
        threading.Thread(target=self._loop, name="raymodel-jobs", daemon=True).start()

    # ------------------------------------------------------------- clients
    def submit(self, kind: str, payload: bytes, info: dict[str, Any]) -> dict[str, Any]:
        """Queue a job; its record and payload are in storage when this returns. ``info["id"]`` (made by
        the client) makes a retried call (the server restarted under it) find the job it queued."""
        book = self.book
        job_id = info.get("id") or _store.new_id(kind)
        with book.lock:
            if job_id in book.records:
                return self._view(job_id)
        needs = dict(info["needs"])
        record = JobRecord(
            id=job_id,
            kind=kind,
            needs=needs,
            model_class=info["model_class"],
            settings=info["settings"],
            submitted=time.time(),
            epochs=info.get("epochs"),
            metric=info.get("metric"),
            mode=info.get("mode"),
            priority=int(info.get("priority", 0)),
            preemptible=bool(info.get("preemptible", True)),
            resource_wait_s=info.get("resource_wait_s"),
            register=info.get("register"),
            durable=not info.get("not_durable"),
            not_durable=info.get("not_durable"),
            runtime_env=info.get("runtime_env") or {},  # its runner's and pool's (`remote.job_env`)
            pool_key=info["pool"]["key"] if info.get("pool") else None,
            trial_id=info.get("trial_id"),
            run_path=info.get("run_path"),
        )
        total = {k: float(v) for k, v in ray.cluster_resources().items()}
        never = fits(needs, total)
        with book.lock:
            book.records[job_id] = record
            book.extras[job_id] = {k: info.get(k) for k in ("pool", "hub", "datasets", "refs")}
            if never is not None:
                book.finish(
                    job_id,
                    "FAILED",
                    error=f"The job can never run on this cluster: it needs "
                    f"{_show(needs)}, and the whole cluster has {_show(total, needs)}.",
                )
            else:
                _store.save_payload(job_id, payload, info.get("pool"))  # before the record that names it
                book.payloads[job_id] = payload
                book.log(job_id, f"submitted; needs {_show(needs)}")
                if record.not_durable:
                    book.log(job_id, f"not durable: {record.not_durable}")
                book.save(job_id)
        self.scheduler.schedule()
        with book.lock:
            return self._view(job_id)

    def get(self, job_id: str, timeout: float = 0.0) -> dict[str, Any] | None:
        """The record without its rows; waits up to ``timeout`` s for the job to end (a long poll)."""
        with self.book.changed:
            self.book.changed.wait_for(
                lambda: job_id not in self.book.records or not self.book.records[job_id].active, timeout=timeout
            )
            return self._view(job_id) if job_id in self.book.records else None

    def _view(self, job_id: str) -> dict[str, Any]:
        """A job's record without its rows, with its ETA (under the lock)."""
        shown = self.book.records[job_id].as_dict()
        del shown["history"]
        return {**shown, "eta": self.scheduler.etas().get(job_id)}

    def list(self) -> builtins.list[dict[str, Any]]:
        with self.book.lock:
            eta = self.scheduler.etas()
            return [
                {
                    **{k: v for k, v in r.as_dict().items() if k not in ("history", "log", "result", "trials")},
                    "eta": eta.get(r.id),
                    "last_epoch": r.last_epoch,
                    "rows": len(r.history),
                    "num_trials": len(r.trials),
                    "result_path": (r.result or {}).get("path"),
                }
                for r in sorted(self.book.records.values(), key=lambda r: r.submitted)
            ]

    def rows(self, job_id: str, start: int = 0, timeout: float = 0.0) -> tuple[builtins.list[dict[str, Any]], str]:
        """The rows from ``start`` on and the status; waits up to ``timeout`` s for one (a long poll)."""
        rows, status, _ = self.follow(job_id, start, timeout)
        return rows, status

    def follow(
        self, job_id: str, start: int = 0, timeout: float = 0.0
    ) -> tuple[builtins.list[dict[str, Any]], str, dict[str, Any] | None]:
        """``rows``, and the record (as ``get`` gives it) once the job has ended with no row left to read:
        a stream's last answer is also what ``job.wait()`` would ask for next."""
        with self.book.changed:
            record = self.book.records[job_id]
            self.book.changed.wait_for(lambda: len(record.history) > start or not record.active, timeout=timeout)
            rows, status = record.history[start:], record.status
            return rows, status, None if rows or record.active else self._view(job_id)

    def stop(self, job_id: str) -> str:
        return self.jobs.stop(job_id)

    def stop_trial(self, trial_id: str) -> None:
        """Stop the jobs a Tune trial submitted (the trial ended)."""
        self.jobs.stop_trial(trial_id)

    def update(self, job_id: str, config: dict[str, Any] | None, settings: dict[str, Any] | None) -> dict[str, Any]:
        return self.jobs.update(job_id, config, settings)

    def drain(self) -> builtins.list[str]:
        return self.scheduler.drain()

    def pools_info(self) -> builtins.list[dict[str, Any]]:
        return self.pools.info()

    def release_pools(self, timeout: float = 120.0) -> builtins.list[str]:
        return self.pools.release(timeout)

    def make_room(self, needs: dict[str, float] | None, timeout: float = 120.0) -> builtins.list[str]:
        return self.pools.make_room(needs, timeout)

    def set_pool_idle_s(self, seconds: float) -> None:
        self.pools.idle_s = float(seconds)

    def warm(self, specs: builtins.list[tuple[str, int]]) -> builtins.list[str]:
        """Keep a pool of each ``(backend, workers)`` warm from now on (``[]``: none); returns the ids of
        the pools started. The next job's runner imports their frameworks meanwhile."""
        with self.book.lock:
            self.runners.warm(specs)
            return self.pools.warm(specs)

    # ------------------------------------------------------------- runs
    def stopping(self, job_id: str) -> bool:
        """Whether the job was asked to stop (its workers ask at each epoch's end)."""
        return self.jobs.stopping(job_id)

    def control(self, job_id: str, epoch: int, known: int) -> dict[str, Any]:
        return self.jobs.control(job_id, epoch, known)

    def restored(self, job_id: str, history: builtins.list[dict[str, Any]]) -> None:
        self.jobs.restored(job_id, history)

    def done_computing(self, job_id: str) -> None:
        self.jobs.done_computing(job_id)

    def worker_lost(self, job_id: str, errors: dict[int, str]) -> None:
        self.jobs.worker_lost(job_id, errors)

    def push(self, job_id: str, rows: builtins.list[dict[str, Any]]) -> None:
        with self.book.lock:
            record = self.book.records[job_id]
            for row in rows:
                _add_row(record.history, record.tagged(row))  # an epoch run again replaces its row
            times = self.book.row_times.setdefault(job_id, [])
            times.extend(time.time() for _ in rows)
            del times[: max(len(times) - len(record.history), 0)]
            self.book.changed.notify_all()
            for row in rows:
                if "end" in row:  # a release's stage ended
                    self.book.log(job_id, describe(row))
                    continue
                shown = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "epoch"}
                where = f"trial {row['trial_id']} " if "trial_id" in row else ""
                self.book.log(
                    job_id,
                    f"{where}epoch {row.get('epoch')}: " + "  ".join(f"{k} {v:.4g}" for k, v in sorted(shown.items())),
                )
            self.book.save(job_id)

    def trial(self, job_id: str, trial_id: str, info: dict[str, Any]) -> None:
        """A tune job's trial started (its config) or ended (its status)."""
        with self.book.lock:
            self.book.records[job_id].trials.setdefault(trial_id, {}).update(info)
            self.book.save(job_id)

    def hold(self, job_id: str, placement_group: str) -> None:
        """A placement group the job's workers or trials run in (what it holds: Ray's state API)."""
        with self.book.lock:
            held = self.book.records[job_id].placement_groups
            if placement_group not in held:
                held.append(placement_group)
                self.book.save(job_id)  # a restarted server removes what its predecessor's runs held

    # ------------------------------------------------------------ internals
    def _loop(self) -> None:
        while True:
            try:
                self.watched.reap(timeout=0.25)  # back at the first end (a job's, a pool's)
                self.pools.expire()
                self.pools.rewarm()
                self.jobs.watch_waits()
                self.scheduler.schedule()
                self.recovery.prune(set(self.pools.pools))
                self.recovery.sweep()
            except Exception:  # noqa: BLE001 - the loop must outlive any one failure
                traceback.print_exc()
                time.sleep(0.5)

    def _run_ended(self, job_id: str, ref: Any) -> None:
        """A job's run (its runner's call) ended: the job ends as its outcome says, or waits again."""
        try:
            outcome = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the runner itself died
            outcome = {"error": f"The job's runner died: {exc}", "runner_died": True}
        if self.recovery.left_to_next_server(job_id, outcome):
            return
        book = self.book
        with book.lock:
            record = book.records[job_id]
            stopped = record.stopping
            if record.fail_with:
                given, record.fail_with = record.fail_with, None
                book.finish(job_id, "FAILED", error=given)
            elif record.stop_now:
                record.stop_now = False
                book.finish(job_id, "STOPPED", result=stored_result(record))
            elif outcome.get("error"):
                book.finish(job_id, "FAILED", error=outcome["error"], detail=outcome.get("traceback"))
            elif record.preempting and not stopped and not _all_epochs(record, outcome["result"]):
                self.scheduler.requeue(record)
            elif not stopped and record.register:
                registered, error = register_result(job_id, record.kind, record.register, outcome["result"])
                record.registered = registered
                book.finish(job_id, "FAILED" if error else "SUCCEEDED", result=outcome["result"], error=error)
            else:  # a release's outcome may say how it ended: REJECTED, ROLLED_BACK
                status = "STOPPED" if stopped else outcome.get("status", "SUCCEEDED")
                book.finish(job_id, status, result=outcome["result"])
            if record.pool_id:
                self.pools.returned(record.pool_id, usable=outcome.get("pool_ok", True))
            self.runners.finished(job_id, own_env=bool(record.runtime_env))
            if record.status != "PENDING":
                book.extras.pop(job_id, None)


def _add_row(history: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """Append ``row``; a row of an epoch already there (of the same trial) replaces it and every row
    after it, so that the history holds each epoch once, in order."""
    epoch, trial = row.get("epoch"), row.get("trial_id")
    if epoch is not None:
        for i, old in enumerate(history):
            if old.get("trial_id") == trial and old.get("epoch") is not None and old["epoch"] >= epoch:
                mine = [r for r in history[i:] if r.get("trial_id") != trial]
                del history[i:]
                history.extend(mine)
                break
    history.append(row)


def _all_epochs(record: JobRecord, result: dict[str, Any] | None) -> bool:
    """Whether a run ended at its last epoch (a preempted job that got there anyway is done)."""
    history = (result or {}).get("history") or record.history
    done = max((int(r.get("epoch", 0)) for r in history), default=0)
    return done >= int(record.epochs or 0)


def _show(resources: dict[str, float], only: dict[str, float] | None = None) -> str:
    keys = sorted(only or resources)
    return ", ".join(f"{resources.get(k, 0.0):g} {k}" for k in keys) or "nothing"


#: Ray restarts the actor when it dies (``max_restarts``), and a call made meanwhile waits for the new
#: one (``max_task_retries``): a client's long poll rides through the restart.
JobServerActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(JobServer)
