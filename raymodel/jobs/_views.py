"""Reading jobs: a job's rows as they arrive (``Stream``), and what jobs hold now (``held``)."""

from __future__ import annotations

import queue
import threading
from typing import Any, AsyncIterator, Iterator

from raymodel.jobs._constants import DONE

#: How long one long poll of the server waits for a row.
LONG_POLL_S = 5.0


class Stream:
    """Iterates a job's rows as they arrive (``for row in job.stream()`` or ``async for``)."""

    def __init__(self, job: Any) -> None:
        self.job, self.seen = job, 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from raymodel._ray import remote

        if remote.active() is not None:
            yield from self._from_off_the_cluster()
            return
        while True:  # a long poll: the server answers when a row arrives or the job ends (or restarts)
            rows, status, ended = self.job._call("follow", self.job.id, self.seen, LONG_POLL_S)
            self.seen += len(rows)
            yield from rows
            if not rows and status in DONE:
                self.job._ended = ended  # what `job.wait()` returns, without asking again
                return

    def _from_off_the_cluster(self) -> Iterator[dict[str, Any]]:
        """One call of the cluster's follows the job there and sends each row here as it comes (a
        thread of its own makes the call; this generator hands the rows on)."""
        rows: queue.Queue = queue.Queue()
        end = object()
        outcome: dict[str, Any] = {}

        def follow() -> None:
            try:
                outcome["ended"] = self.job._follow_off_cluster(self.seen, rows.put)
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                outcome["error"] = exc
            finally:
                rows.put(end)

        threading.Thread(target=follow, name="raymodel-job-rows", daemon=True).start()
        while (row := rows.get()) is not end:
            self.seen += 1
            yield row
        if "error" in outcome:
            raise outcome["error"]
        self.job._ended = outcome["ended"]

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            rows, status, ended = await self.job._server.follow.remote(self.job.id, self.seen, LONG_POLL_S)
            self.seen += len(rows)
            for row in rows:
                yield row
            if not rows and status in DONE:
                self.job._ended = ended
                return


def held(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """What each job holds now: the bundles of its placement groups that Ray's state API shows
    CREATED (one query for all the records; ``{}`` for a job that is not running). Off the cluster, the
    cluster's state API answers in a call of its own."""
    from raymodel._ray import remote

    if remote.active() is not None:
        return remote.call(held, records)
    wanted = {g for r in records if r["status"] == "RUNNING" for g in r.get("placement_groups", ())}
    live: dict[str, dict[str, float]] = {}
    if wanted:
        import ray
        from ray.util.state import list_placement_groups

        address = ray.get_runtime_context().gcs_address  # this cluster's, even with others on the machine
        for group in list_placement_groups(
            address=address,
            filters=[("state", "=", "CREATED")],
            detail=True,
            limit=10_000,
            raise_on_missing_output=False,
        ):
            if group.placement_group_id in wanted:
                live[group.placement_group_id] = _sum(b.get("unit_resources", {}) for b in group.bundles or ())
    return {
        r["id"]: _sum(live.get(g, {}) for g in r.get("placement_groups", ()) if r["status"] == "RUNNING")
        for r in records
    }


def _sum(parts: Any) -> dict[str, float]:
    total: dict[str, float] = {}
    for part in parts:
        for name, amount in part.items():
            total[name] = round(total.get(name, 0.0) + float(amount), 6)
    return {k: v for k, v in total.items() if v}
