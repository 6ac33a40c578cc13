"""``JobBook``: the training server's job records, their payloads and what each job arrived with.

Every change to a record is saved (``jobs/_store.py``) before a client can hear of it. The book's lock
is the server's one lock: each part of the server takes it to read or change records or pools, and
``changed`` wakes the clients' long polls (a row, a status, a pool).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from raymodel.jobs import _store
from raymodel.jobs._server.records import JobRecord

_LOG_LINES = 200


class JobBook:
    def __init__(self) -> None:
        self.records: dict[str, JobRecord] = {}
        #: job id -> the pickled model class, config, settings and data (kept until the job ends: a
        #: preempted job starts again from it)
        self.payloads: dict[str, bytes] = {}
        #: job id -> what it arrived with beside its payload: its pool's spec, its hub, datasets, refs
        self.extras: dict[str, dict[str, Any]] = {}
        #: job id -> when each of its rows arrived (epoch times: ETAs)
        self.row_times: dict[str, list[float]] = {}
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)

    def active(self) -> list[JobRecord]:
        return [r for r in self.records.values() if r.active]

    def running(self) -> list[JobRecord]:
        return [r for r in self.records.values() if r.status == "RUNNING"]

    def log(self, job_id: str, line: str) -> None:
        log = self.records[job_id].log
        log.append(f"{time.strftime('%H:%M:%S')} {line}")
        del log[:-_LOG_LINES]

    def save(self, job_id: str) -> None:
        _store.save_record(self.records[job_id].as_dict())

    def finish(
        self, job_id: str, status: str, result: Any = None, error: str | None = None, detail: str | None = None
    ) -> None:
        """End the job ``status``: its record says so in storage, then its payload and data go."""
        record = self.records[job_id]
        self.payloads.pop(job_id, None)
        for change in record.changes:
            if change.get("epoch") is None:
                change["epoch"] = None
                change["note"] = "not applied: the job ended before its next epoch boundary"
        record.preempting = None
        record.lost = None
        record.status, record.ended, record.reason = status, time.time(), None
        record.result, record.error = result, error
        self.log(job_id, status.lower() + (f": {error}" if error else ""))
        if detail:
            for line in detail.rstrip().splitlines()[-20:]:
                self.log(job_id, line)
        self.save(job_id)
        # Its payload and data go after its record says it ended (the record stays): a server killed in
        # between leaves a folder that the next one removes, never a running job without its payload.
        _store.remove(job_id)
        self.changed.notify_all()
