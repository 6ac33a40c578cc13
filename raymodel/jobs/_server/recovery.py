"""``Recovery``: the training server's part that outlives it: loading what a previous server left
(``recover``, after an actor restart or a new head on the same storage), keeping its disk bounded
(``prune``), and removing what its dead runs held (``sweep``)."""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Callable

import ray

from raymodel.jobs import _store
from raymodel.jobs._server.book import JobBook
from raymodel.jobs._server.records import JobRecord


class Recovery:
    """What the book's server leaves behind it: its records for the next one, its disk bounded, and the
    placement groups of its dead runs removed."""

    def __init__(self, book: JobBook, limits: dict[str, float] | None = None) -> None:
        self.book = book
        self.limits = dict(limits or {})  # pruning: `prune_after_s`, `prune_max_mb`
        self._pruned = self._swept = -1e9

    def prune(self, live_pools: set[str], every_s: float = 60.0) -> None:
        """Now and then, what the server left on disk (``jobs/_prune.py``); ``live_pools``: the pools'
        ids, whose folders stay."""
        if time.monotonic() - self._pruned < every_s:
            return
        self._pruned = time.monotonic()
        from raymodel.jobs._prune import DEFAULTS, prune

        with self.book.lock:
            done = {i for i, r in self.book.records.items() if not r.active}
        gone = prune(live_pools, done, {**DEFAULTS, **self.limits})
        if any(gone.values()):
            print("pruned: " + ", ".join(f"{n} {kind}" for kind, n in gone.items() if n), flush=True)

    def sweep(self, every_s: float = 2.0) -> None:
        """Every ``every_s``, remove the placement groups this server's job made whose creator died
        (``orphaned_groups``: one read of Ray's placement group table)."""
        if time.monotonic() - self._swept < every_s:
            return
        self._swept = time.monotonic()
        gone = orphaned_groups(ray.get_runtime_context().get_job_id())
        _remove_groups(gone)
        if gone:
            print(f"removed {len(gone)} placement group(s) whose creator died: {', '.join(gone)}", flush=True)

    def left_to_next_server(self, job_id: str, outcome: dict[str, Any]) -> bool:
        """Whether a job's failed outcome came from this server's own node going down (``raymodel server
        stop``, a head or raylet lost): its runner, or its pool, ended with the node, not with the job.
        Such a job is left as it is in storage (RUNNING) for the next server on the same storage to resume
        (``recover``), not ended FAILED by a server that is about to end itself. Under load, the runner's
        death ("its owner's node has crashed") can reach the server before its own.

        A runner that died, or a pool that ended under its job, is given ``NODE_GONE_WAIT_S`` for Ray to
        say whether this node went (it says so first, as it did there); any other failure is the job's."""
        record = self.book.records.get(job_id)
        if not outcome.get("error") or (record and (record.fail_with or record.stop_now or record.stopping)):
            return False
        patient = outcome.get("runner_died") or not outcome.get("pool_ok", True)
        deadline = time.monotonic() + (NODE_GONE_WAIT_S if patient else 0.0)
        while node_alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.25)
        print(f"{job_id}: its run ended with this server's node; the next server resumes it", flush=True)
        return True

    def recover(self) -> None:
        """Load the records a previous server (this actor before a restart, or an earlier head with the
        same storage) left: PENDING jobs keep their place, RUNNING ones wait again and resume from their
        newest checkpoint, a stopping one ends STOPPED; a job that cannot be run again fails, saying why."""
        book = self.book
        held: set[str] = set()
        with_folder = _store.folders()
        for record in sorted(map(JobRecord.from_dict, _store.load_records()), key=lambda r: r.submitted):
            job_id = record.id
            book.records[job_id] = record
            held.update(record.placement_groups)
            if not record.active:
                if job_id in with_folder:  # a server killed as it finished the job left it (``JobBook.finish``)
                    _store.remove(job_id)
                continue
            was = record.status
            record.pool_id = record.preempting = record.lost = None
            record.placement_groups = []
            kept = _store.load_payload(job_id) if record.durable else None
            if record.stopping:
                book.finish(job_id, "STOPPED", result=stored_result(record))
            elif record.trial_id:
                book.finish(job_id, "STOPPED", result=None)  # its tune job resumes the trial
            elif not record.durable:
                book.finish(
                    job_id,
                    "FAILED",
                    error=f"The job server restarted while the job was {was}, and the job could not be kept: "
                    f"{record.not_durable or 'it was submitted by an older server'}. Submit it again.",
                )
            elif kept is None:
                book.finish(
                    job_id,
                    "FAILED",
                    error=f"The job server restarted while the job was {was}, and its payload is missing from "
                    f"`{_store.folder(job_id)}`. Submit it again.",
                )
            else:
                book.payloads[job_id], pool = kept
                book.extras[job_id] = {"pool": pool}
                record.restarts += 1
                if was == "RUNNING":
                    record.status, record.resume = "PENDING", True
                    record.reason = "the job server restarted; it resumes from its newest checkpoint"
                    book.log(
                        job_id,
                        f"the job server restarted while it ran (after epoch {record.last_epoch}): it resumes from "
                        "its newest checkpoint"
                        if record.history
                        else "the job server restarted before its first checkpoint: it starts again from epoch 1",
                    )
                else:
                    book.log(job_id, "the job server restarted: still queued, in its place")
                book.save(job_id)
        # The previous server's pools and runs died with it; a worker group that was ending (its Train
        # controller had let Ray Train's cleaner go) can leave its placement group holding resources.
        _remove_groups(sorted(held))
        if not ray.is_initialized():  # the server's state in-process (a test): asking Ray would start it
            return
        context = ray.get_runtime_context()
        # A new head on this storage (not the actor restarted by Ray).
        if context.get_actor_id() is not None and not context.was_current_actor_reconstructed:
            threading.Thread(target=_serve_again, name="raymodel-routes", daemon=True).start()


#: How long a server whose job's runner died waits to learn whether its own node went with it.
NODE_GONE_WAIT_S = 3.0


def node_alive() -> bool:
    """Whether Ray (its GCS) holds this process's node alive; not when it cannot be asked."""
    try:
        here = ray.get_runtime_context().get_node_id()
        return any(node["NodeID"] == here and node.get("Alive") for node in ray.nodes())
    except Exception:  # noqa: BLE001 - a GCS that cannot answer: the head is going down
        return False


def _serve_again() -> None:
    """The routes of registry versions declared on this storage, served again, and their rollouts going on
    (``serve/_routes/declared.py``): a release in its rollout stage goes on after a head restart."""
    from raymodel.serve import restore

    try:
        for line in restore():
            print(line, flush=True)
    except Exception:  # noqa: BLE001 - the server runs on without them; the log says why
        traceback.print_exc()


def stored_result(record: JobRecord) -> dict[str, Any] | None:
    """A training job's result from its run's storage, for a job ended from outside its run (a stop
    while it waited, a restart while it stopped): the newest checkpoint, and the history so far."""
    path = record.run_path
    if record.kind != "train" or not path:
        return None
    from raymodel._internal import storage
    from raymodel.contract import checkpoint as ckpt

    epochs = sorted(e for e in (ckpt.epoch_of(n) for n in storage.listdir(path)) if e is not None)
    history = [r for r in record.history if int(r.get("epoch", 0)) <= (epochs[-1] if epochs else 0)]
    return {
        "metrics": dict(history[-1]) if history else {},
        "history": history,
        "checkpoint": storage.join(path, f"checkpoint_epoch_{epochs[-1]:06d}") if epochs else None,
        "best_checkpoint": None,
        "path": path,
        "config": {},
        "name": path.rstrip("/").rsplit("/", 1)[-1],
    }


def orphaned_groups(job_id: str) -> list[str]:
    """The placement groups, by id, that ``job_id``'s actors made and that outlived their maker: Ray
    keeps a group until its job ends, and this server's job lasts as long as the server. No one can
    use such a group; a waiting one takes its resources the moment they return. (A group the job's
    driver made has no creator actor, and Ray calls that one dead too: it is kept.)"""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    ActorTableData, Group = gcs_pb2.ActorTableData, gcs_pb2.PlacementGroupTableData  # type: ignore[attr-defined]

    try:
        accessor = state._connect_and_get_accessor()
        rows = [Group.FromString(row) for row in accessor.get_placement_group_table()]
    except Exception:  # noqa: BLE001 - no table, nothing removed
        return []

    def dead(actor_id: bytes) -> bool:
        try:
            info = accessor.get_actor_info(ray.ActorID(actor_id))
        except Exception:  # noqa: BLE001 - not known to be dead: kept
            return False
        return info is not None and ActorTableData.FromString(info).state == ActorTableData.DEAD

    return orphans(rows, job_id, dead)


def orphans(groups: list[Any], job_id: str, dead: Callable[[bytes], bool]) -> list[str]:
    """Of Ray's placement group rows (``PlacementGroupTableData``), the ids of those ``job_id``'s
    actors made whose maker is dead. Ray's own mark (``creator_actor_dead``) is missing on some: a
    pool's Train controller that died with its pool (its owner) left a group CREATED, unmarked,
    holding both CPUs of a 2-CPU machine, and every job after it waited for ever. So a group whose
    maker Ray has not marked is kept only if the actor table (``dead``) says its maker lives."""
    found = []
    for group in groups:
        if (
            group.state != type(group).REMOVED
            and not group.is_detached
            and not ray.ActorID(group.creator_actor_id).is_nil()
            and group.creator_job_id.hex() == job_id
            and (group.creator_actor_dead or dead(group.creator_actor_id))
        ):
            found.append(group.placement_group_id.hex())
    return found


def _remove_groups(ids: list[str]) -> None:
    from ray.util.placement_group import PlacementGroup

    for pg_id in ids:
        try:
            ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
        except Exception:  # noqa: BLE001 - already gone
            pass
