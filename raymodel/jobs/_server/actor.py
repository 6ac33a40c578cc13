"""The training server: a named Ray actor that owns the job records and runs each job.

Each job runs in its own ``JobRunner`` actor (no resources of its own; the run's workers or trials hold them).
A training job runs on a pool (a resident worker group, ``jobs/_pools/pool.py``) that fits what its workers
need: an idle one, or a new one when the cluster's free resources allow; ``pool=False`` jobs and tune jobs
call the blocking verb (``Trainable.fit`` or ``Tunable.fit``) as ``model.train()`` and ``model.tune()`` do.
Either way every epoch row reaches the server. A PENDING job waits, by priority then first in first out
(``jobs/_server/queue.py``), with the reason; a job that cannot fit preempts running jobs of lower priority.
Running jobs are changed, stopped and watched through ``JobControl`` (``jobs/_server/control.py``). An idle
pool ends after ``pool_idle_s``, at once when a job or anything else (Ray reports pending demand) needs its
resources, or on ``release_pools``.

Durable: every record and payload is in storage (``jobs/_store.py``) before
``submit`` answers. The actor restarts by itself when it dies (Ray's actor
restarts; its runners and pools die with it), and a new head with the same
storage starts it again (``raymodel server start``): either way ``_recover``
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
from raymodel.jobs._constants import ACTIVE, DEFAULT_POOL_IDLE_S
from raymodel.jobs._from_registry import register_result
from raymodel.jobs._pools.keeper import PoolKeeper
from raymodel.jobs._release_plan import describe
from raymodel.jobs._server.control import JobControl
from raymodel.jobs._server.queue import fits
from raymodel.jobs._server.recovery import Recovery, stored_result
from raymodel.jobs._server.runner import new_runner
from raymodel.jobs._server.scheduler import Scheduler
from raymodel.jobs._server.state import tagged

_LOG_LINES = 200


class JobServer(Scheduler, PoolKeeper, JobControl, Recovery):
    """Job records, a priority queue (``Scheduler``), pools (``PoolKeeper``), changes and waits
    (``JobControl``), restarts and disk (``Recovery``), and one runner actor per running job."""

    def __init__(
        self, home: str, pool_idle_s: float = DEFAULT_POOL_IDLE_S, limits: dict[str, float] | None = None
    ) -> None:
        os.environ["RAYMODEL_HOME"] = home  # records and runs go where the first client's home is
        self.pool_idle_s = float(pool_idle_s)
        self.limits = dict(limits or {})  # pruning: `prune_after_s`, `prune_max_mb`
        self._pruned = self._swept = -1e9
        self.records = {}
        self.payloads = {}
        self.extras = {}  # per job: its pool's spec, its hub
        self.runners = {}
        self.done_refs = {}
        self.pools = {}
        self.pool_actors = {}
        self.pool_refs = {}  # each pool's end
        self.ready_refs = {}  # each pool's readiness
        self.warm_pools, self.warm_runs = {}, ()  # kept warm (`warm`)
        self._warmed = -1e9
        self._room_seen = False
        self._demand_checked = 0.0
        self.row_times = {}  # when each row arrived (epoch times: ETAs)
        self.alive_nodes, self.lost_nodes = set(), {}  # lost: node id -> when it was seen dead
        self._nodes_checked, self.draining = 0.0, False
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # a row, a status: wakes the clients' long polls
        self.wake = threading.Event()
        self.spare = new_runner()
        with self.lock:
            self._recover()
        threading.Thread(target=self._loop, name="raymodel-jobs", daemon=True).start()

    # ------------------------------------------------------------- clients
    def submit(self, kind: str, payload: bytes, info: dict[str, Any]) -> dict[str, Any]:
        """Queue a job; its record and payload are in storage when this returns. ``info["id"]`` (made by
        the client) makes a retried call (the server restarted under it) find the job it queued."""
        job_id = info.get("id") or _store.new_id(kind)
        with self.lock:
            if job_id in self.records:
                return self._view(job_id)
        needs = dict(info["needs"])
        record = {
            "id": job_id,
            "kind": kind,
            "status": "PENDING",
            "reason": "queued",
            "needs": needs,
            "model_class": info["model_class"],
            "settings": info["settings"],
            "submitted": time.time(),
            "started": None,
            "ended": None,
            "history": [],
            "result": None,
            "error": None,
            "log": [],
            "epochs": info.get("epochs"),
            "placement_groups": [],
            "trials": {},
            "metric": info.get("metric"),
            "mode": info.get("mode"),
            "priority": int(info.get("priority", 0)),
            "preemptible": bool(info.get("preemptible", True)),
            "resource_wait_s": info.get("resource_wait_s"),
            "changes": [],
            "preemptions": 0,
            "register": info.get("register"),
            "registered": None,
            "durable": not info.get("not_durable"),
            "not_durable": info.get("not_durable"),
            "restarts": 0,
            "runtime_env": info.get("runtime_env") or {},  # its runner's and pool's (`remote.job_env`)
        }
        if info.get("pool"):
            record["pool_key"] = info["pool"]["key"]
        if info.get("trial_id"):
            record["trial_id"] = info["trial_id"]
        if info.get("run_path"):
            record["run_path"] = info["run_path"]
        total = {k: float(v) for k, v in ray.cluster_resources().items()}
        never = fits(needs, total)
        with self.lock:
            self.records[job_id] = record
            self.extras[job_id] = {k: info.get(k) for k in ("pool", "hub", "datasets", "refs")}
            if never is not None:
                self._finish(
                    job_id,
                    "FAILED",
                    error=f"The job can never run on this cluster: it needs "
                    f"{_show(needs)}, and the whole cluster has {_show(total, needs)}.",
                )
            else:
                _store.save_payload(job_id, payload, info.get("pool"))  # before the record that names it
                self.payloads[job_id] = payload
                self._log(job_id, f"submitted; needs {_show(needs)}")
                if info.get("not_durable"):
                    self._log(job_id, f"not durable: {info['not_durable']}")
                self._save(job_id)
        self._schedule()
        with self.lock:
            return self._view(job_id)

    def get(self, job_id: str, timeout: float = 0.0) -> dict[str, Any] | None:
        """The record without its rows; waits up to ``timeout`` s for the job to end (a long poll)."""
        with self.changed:
            self.changed.wait_for(
                lambda: self.records.get(job_id, {}).get("status", "DONE") not in ACTIVE, timeout=timeout
            )
            return self._view(job_id) if job_id in self.records else None

    def _view(self, job_id: str) -> dict[str, Any]:
        """A job's record without its rows, with its ETA (under the lock)."""
        record = self.records[job_id]
        return {**{k: v for k, v in record.items() if k != "history"}, "eta": self._etas().get(job_id)}

    def list(self) -> builtins.list[dict[str, Any]]:
        with self.lock:
            eta = self._etas()
            return [
                {
                    **{k: v for k, v in r.items() if k not in ("history", "log", "result", "trials")},
                    "eta": eta.get(r["id"]),
                    "last_epoch": max((row.get("epoch", 0) for row in r["history"]), default=0),
                    "rows": len(r["history"]),
                    "num_trials": len(r.get("trials") or {}),
                    "result_path": (r.get("result") or {}).get("path"),
                }
                for r in sorted(self.records.values(), key=lambda r: r["submitted"])
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
        with self.changed:
            record = self.records[job_id]
            self.changed.wait_for(
                lambda: len(record["history"]) > start or record["status"] not in ACTIVE, timeout=timeout
            )
            rows, status = record["history"][start:], record["status"]
            return rows, status, None if rows or status in ACTIVE else self._view(job_id)

    def stop(self, job_id: str) -> str:
        with self.lock:
            record = self.records.get(job_id)
            if record is None:
                return "missing"
            if record["status"] == "PENDING":
                self._finish(job_id, "STOPPED", result=None)
            elif record["status"] == "RUNNING" and (record.get("lost") or record.get("reason")):
                # It waits for lost resources: no epoch will end for it to stop at.
                record["stopping"] = True
                record["stop_now"] = True
                self._log(job_id, "stop requested while it waits: it ends now, with its newest checkpoint")
                self._abandon(record)
            elif record["status"] == "RUNNING" and not record.get("stopping"):
                record["stopping"] = True
                self._log(job_id, "stop requested: the current epoch ends, a checkpoint is written")
                self._save(job_id)
                self.runners[job_id].stop.remote()
            return record["status"]

    def stop_trial(self, trial_id: str) -> None:
        """Stop the jobs a Tune trial submitted (the trial ended)."""
        with self.lock:
            ids = [r["id"] for r in self.records.values() if r.get("trial_id") == trial_id and r["status"] in ACTIVE]
        for job_id in ids:
            self.stop(job_id)

    def stopping(self, job_id: str) -> bool:
        """Whether the job was asked to stop (its workers ask at each epoch's end)."""
        with self.lock:
            return bool(self.records.get(job_id, {}).get("stopping"))

    def push(self, job_id: str, rows: builtins.list[dict[str, Any]]) -> None:
        with self.lock:
            record = self.records[job_id]
            for row in rows:
                _add_row(record["history"], tagged(record, row))  # an epoch run again replaces its row
            times = self.row_times.setdefault(job_id, [])
            times.extend(time.time() for _ in rows)
            del times[: max(len(times) - len(record["history"]), 0)]
            self.changed.notify_all()
            for row in rows:
                if "end" in row:  # a release's stage ended
                    self._log(job_id, describe(row))
                    continue
                shown = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "epoch"}
                where = f"trial {row['trial_id']} " if "trial_id" in row else ""
                self._log(
                    job_id,
                    f"{where}epoch {row.get('epoch')}: " + "  ".join(f"{k} {v:.4g}" for k, v in sorted(shown.items())),
                )
            self._save(job_id)

    def trial(self, job_id: str, trial_id: str, info: dict[str, Any]) -> None:
        """A tune job's trial started (its config) or ended (its status)."""
        with self.lock:
            self.records[job_id].setdefault("trials", {}).setdefault(trial_id, {}).update(info)
            self._save(job_id)

    def hold(self, job_id: str, placement_group: str) -> None:
        """A placement group the job's workers or trials run in (what it holds: Ray's state API)."""
        with self.lock:
            held = self.records[job_id].setdefault("placement_groups", [])
            if placement_group not in held:
                held.append(placement_group)
                self._save(job_id)  # a restarted server removes what its predecessor's runs held

    # ------------------------------------------------------------ internals
    def _loop(self) -> None:
        while True:
            try:
                self._reap(timeout=0.25)
                self._expire_pools()
                self._rewarm()
                self._watch_waits()
                self._schedule()
                self._prune()
                self._sweep()
            except Exception:  # noqa: BLE001 - the loop must outlive any one failure
                traceback.print_exc()
                time.sleep(0.5)

    def _reap(self, timeout: float) -> None:
        # Back at the first end (a job's, a pool's; `watch` sets `wake`): a job's caller waits for it.
        self.wake.clear()
        ready = self.ended()
        if not ready:
            self.wake.wait(timeout)
            ready = self.ended()
        for ref in ready:
            if ref in self.ready_refs:
                self._pool_ready(self.ready_refs.pop(ref), ref)
                continue
            if ref in self.pool_refs:
                self._pool_ended(self.pool_refs.pop(ref), ref)
                continue
            job_id = self.done_refs.pop(ref)
            try:
                outcome = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the runner itself died
                outcome = {"error": f"The job's runner died: {exc}", "runner_died": True}
            if self._left_to_next_server(job_id, outcome):
                continue
            with self.lock:
                record = self.records[job_id]
                stopped = record.get("stopping")
                if record.get("fail_with"):
                    self._finish(job_id, "FAILED", error=record.pop("fail_with"))
                elif record.pop("stop_now", None):
                    self._finish(job_id, "STOPPED", result=stored_result(record))
                elif outcome.get("error"):
                    self._finish(job_id, "FAILED", error=outcome["error"], detail=outcome.get("traceback"))
                elif record.get("preempt_by") and not stopped and not _all_epochs(record, outcome["result"]):
                    self._requeue(record)
                elif not stopped and record.get("register"):
                    registered, error = register_result(record, outcome["result"])
                    record["registered"] = registered
                    self._finish(job_id, "FAILED" if error else "SUCCEEDED", result=outcome["result"], error=error)
                else:  # a release's outcome may say how it ended: REJECTED, ROLLED_BACK
                    status = "STOPPED" if stopped else outcome.get("status", "SUCCEEDED")
                    self._finish(job_id, status, result=outcome["result"])
                pool = self.pools.get(record.get("pool_id") or "")
                if pool is not None and pool["state"] == "busy":
                    if outcome.get("pool_ok", True):
                        pool.update(state="idle", job=None, idle_since=time.time(), jobs_run=pool["jobs_run"] + 1)
                    else:
                        pool["jobs_run"] += 1
                        self._end_pool(pool["id"], "a job left it unusable", force=True)
                runner = self.runners.pop(job_id, None)
                if runner is not None and record.get("runtime_env"):
                    ray.kill(runner)  # a runner of the job's own runtime env: no spare for the others
                    runner = None
                if record["status"] != "PENDING":
                    self.extras.pop(job_id, None)
            if runner is not None:
                finished = runner
                with self.lock:  # the finished job's process waits for the next job (its imports done)
                    runner, self.spare = (runner, None) if self.spare is not None else (None, runner)
                if runner is not None:
                    ray.kill(runner)
                elif self.warm_runs:  # the spare again: it starts ahead what it ended with its job
                    finished.warm.remote((), self.warm_runs)

    def _finish(
        self, job_id: str, status: str, result: Any = None, error: str | None = None, detail: str | None = None
    ) -> None:
        record = self.records[job_id]
        self.payloads.pop(job_id, None)
        for change in record.get("changes") or ():
            if change.get("epoch") is None:
                change["epoch"] = None
                change["note"] = "not applied: the job ended before its next epoch boundary"
        record.pop("preempt_by", None)
        record.pop("lost", None)
        record.update(status=status, ended=time.time(), reason=None, result=result, error=error)
        self._log(job_id, status.lower() + (f": {error}" if error else ""))
        if detail:
            for line in detail.rstrip().splitlines()[-20:]:
                self._log(job_id, line)
        self._save(job_id)
        # Its payload and data go after its record says it ended (the record stays): a server killed in
        # between leaves a folder that the next one removes, never a running job without its payload.
        _store.remove(job_id)
        self.changed.notify_all()

    def _log(self, job_id: str, line: str) -> None:
        log = self.records[job_id]["log"]
        log.append(f"{time.strftime('%H:%M:%S')} {line}")
        del log[:-_LOG_LINES]

    def _save(self, job_id: str) -> None:
        _store.save_record(self.records[job_id])


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


def _all_epochs(record: dict[str, Any], result: dict[str, Any] | None) -> bool:
    """Whether a run ended at its last epoch (a preempted job that got there anyway is done)."""
    history = (result or {}).get("history") or record["history"]
    done = max((int(r.get("epoch", 0)) for r in history), default=0)
    return done >= int(record.get("epochs") or 0)


def _show(resources: dict[str, float], only: dict[str, float] | None = None) -> str:
    keys = sorted(only or resources)
    return ", ".join(f"{resources.get(k, 0.0):g} {k}" for k in keys) or "nothing"


#: Ray restarts the actor when it dies (``max_restarts``), and a call made meanwhile waits for the new
#: one (``max_task_retries``): a client's long poll rides through the restart.
JobServerActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(JobServer)
