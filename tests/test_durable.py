"""A durable training server: what it writes before a job is queued, what it prunes, and the chaos
test (a queue of jobs through kills of the server actor, a pool's worker and the whole head).

The server actor killed mid-job on the session's Ray is in tests/test_jobs.py; a stop of a job
that waits for a lost node, in tests/nodeloss.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lane
import numpy as np
import pytest
from models import TinyNet

import raymodel as rm
from raymodel.data import Arrays, DataSpec, RayDataset


def _request(X, y, **settings):
    from raymodel.jobs._request import train_request
    from raymodel.train import prepare

    model = TinyNet()
    checked, spec = prepare(model, {"num_workers": 1, "progress": False, **settings}, {"train": (X, y)})
    return train_request(model, checked, spec)


def test_large_arrays_are_written_once_to_the_jobs_storage_and_the_payload_names_them(no_ray, tmp_path, monkeypatch):
    from raymodel._internal import serialization
    from raymodel.jobs import _store
    from raymodel.jobs._request import restore_refs

    monkeypatch.setenv("RAYMODEL_HOME", str(tmp_path))
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200_000, 4)).astype(np.float32)  # 3.2 MB: over FILE_BYTES
    y = (X[:, 0] > 0).astype(np.int64)
    blob, info = _request(X, y)
    assert len(blob) < 200_000, len(blob)  # the arrays are not in it
    assert info["not_durable"] is None and info["id"].startswith("train-")
    folder = tmp_path / "jobs" / info["id"] / "data"
    assert sorted(os.listdir(folder)) == ["train-x.npy", "train-y.npy"]  # no staged leftovers
    assert np.array_equal(np.load(folder / "train-x.npy"), X) and np.array_equal(np.load(folder / "train-y.npy"), y)
    spec = serialization.loads(blob)["data"]
    stored = spec.splits["train"].x
    assert isinstance(stored, _store.StoredArray) and stored.shape == X.shape and stored.nbytes == X.nbytes
    restore_refs(spec, None, None, into_store=False)  # a tune job's runner: memory maps of the files
    assert np.array_equal(spec.splits["train"].x, X) and np.array_equal(spec.splits["train"].y, y)

    small, small_info = _request(X[:64], y[:64])  # small arrays ride in the payload
    assert not (tmp_path / "jobs" / small_info["id"]).exists()
    assert np.array_equal(serialization.loads(small)["data"].splits["train"].x, X[:64])


def test_data_held_only_in_the_object_store_makes_a_job_not_durable_and_says_how_to_fix_it():
    from raymodel.jobs._request import why_not_durable

    rows = np.zeros((4, 2), dtype=np.float32)
    assert why_not_durable(DataSpec({"train": Arrays(rows, None)})) is None
    reason = why_not_durable(DataSpec({"train": Arrays(rows, None), "valid": RayDataset("valid", None)}))
    assert reason.startswith("its 'valid' split is a `ray.data` Dataset")
    assert "To make it durable, pass arrays" in reason

    class ObjectRef:  # what `ray.put` returns, by name (no Ray here)
        pass

    reason = why_not_durable(DataSpec({"train": Arrays(ObjectRef(), None)}, signature={}))
    assert "ObjectRefs" in reason and "pass the numpy arrays themselves" in reason


def test_a_record_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    from raymodel._internal import storage

    target = tmp_path / "jobs" / "train-1.json"
    storage.write_text(str(target), json.dumps({"status": "PENDING"}))

    def killed(*args):  # the process dies after writing the new record, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        storage.write_text(str(target), json.dumps({"status": "RUNNING", "history": [1] * 1000}))
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"status": "PENDING"}  # the old record, whole
    assert os.listdir(target.parent) == ["train-1.json"]  # and nothing half-written beside it


def test_a_server_killed_as_a_job_ends_leaves_it_ended_and_the_next_removes_its_folder(tmp_path, monkeypatch):
    """A job's record says it ended before its payload goes: a server killed in between (seen under load in
    the chaos test: a job resumed as RUNNING without its payload, and failed) leaves an ended job and a
    folder, which the next server removes. In-process: the server's book and recovery on their own."""

    from raymodel.jobs import _store
    from raymodel.jobs._server.book import JobBook
    from raymodel.jobs._server.records import JobRecord
    from raymodel.jobs._server.recovery import Recovery

    monkeypatch.setenv("RAYMODEL_HOME", str(tmp_path))
    job_id = "train-20261128-120000-abcdef"
    record = JobRecord(job_id, "train", "RUNNING", submitted=1.0, durable=True)
    _store.save_payload(job_id, b"the job", None)
    _store.save_record(record.as_dict())

    first = JobBook()
    first.records[job_id], first.payloads[job_id] = record, b"the job"

    def killed(job_id: str) -> None:  # the server dies as it removes the job's folder
        raise KeyboardInterrupt

    with monkeypatch.context() as kill:
        kill.setattr(_store, "remove", killed)
        with pytest.raises(KeyboardInterrupt):
            first.finish(job_id, "SUCCEEDED")
    (stored,) = _store.load_records()
    assert stored["status"] == "SUCCEEDED"  # ended, not a RUNNING job whose payload is gone
    assert _store.folders() == {job_id}

    Recovery(JobBook()).recover()
    (stored,) = _store.load_records()
    assert stored["status"] == "SUCCEEDED" and _store.folders() == set()  # the next server removed the folder


@pytest.mark.integration
def test_a_runner_that_ends_with_the_servers_node_leaves_its_job_to_the_next_server(ray_session, tmp_path, monkeypatch):
    """``raymodel server stop`` (or a lost raylet) ends a job's runner before the server: a server that sees
    the runner's death while its own node is gone leaves the job RUNNING in storage, for the next server
    to resume, not FAILED (clean-clone run 22: the chaos test's head restart failed a running job with
    "The job's runner died ... Owner's node has crashed"). A runner that died on a live node fails its
    job, as before. In-process: the server's parts, with a real call that ended in an
    error; the node's liveness as Ray reports it, then as a stopping head's."""

    import ray

    from raymodel.jobs import _store
    from raymodel.jobs._server import recovery
    from raymodel.jobs._server.actor import JobServer
    from raymodel.jobs._server.book import JobBook
    from raymodel.jobs._server.records import JobRecord
    from raymodel.jobs._server.watched import Watched

    monkeypatch.setenv("RAYMODEL_HOME", str(tmp_path))
    monkeypatch.setattr(recovery, "NODE_GONE_WAIT_S", 0.5)
    assert recovery.node_alive()  # this process's node, as Ray holds it

    @ray.remote(num_cpus=0)
    def runner_call() -> None:
        raise RuntimeError("the runner's process ended")

    class Unused:  # the parts a runner's end does not reach here (no pool, no runner of the server's)
        def finished(self, job_id: str, own_env: bool) -> None:
            pass

    def server(job_id: str) -> JobServer:
        made = object.__new__(JobServer)  # its parts, without its actor's thread, runners and pools
        made.book, made.watched, made.runners = JobBook(), Watched(), Unused()
        made.recovery = recovery.Recovery(made.book)
        made.book.records[job_id] = JobRecord(job_id, "train", "RUNNING", submitted=1.0, durable=True)
        _store.save_payload(job_id, b"the job", None)
        made.book.save(job_id)
        # as the scheduler's launch does: its end wakes the loop, and goes to the server
        made.watched.watch(runner_call.remote(), lambda ref: made._run_ended(job_id, ref))
        return made

    alive = server("train-20261129-120000-aaaaaa")
    alive.watched.reap(timeout=60)
    (failed,) = _store.load_records()
    assert failed["status"] == "FAILED" and failed["error"].startswith("The job's runner died"), failed

    gone = server("train-20261129-120000-bbbbbb")
    monkeypatch.setattr(recovery, "node_alive", lambda: False)
    gone.watched.reap(timeout=60)
    assert not gone.watched.calls  # taken, and left
    stored = {r["id"]: r for r in _store.load_records()}
    assert stored["train-20261129-120000-bbbbbb"]["status"] == "RUNNING"
    assert "train-20261129-120000-bbbbbb" in _store.folders()  # its payload stays, for the next server
    following = recovery.Recovery(JobBook())
    following.recover()  # the next head's server
    resumed = following.book.records["train-20261129-120000-bbbbbb"]
    assert resumed.status == "PENDING" and resumed.resume and resumed.restarts == 1, resumed


def test_the_servers_loop_wakes_when_a_call_that_began_during_its_wait_ends(ray_session):
    """A job that ``submit`` launched while the server's loop waited (for the calls it watched when the wait
    began) was seen to end only when that wait ran out: a warm job's end waited for the loop's 0.25-s
    tick (its wall 0.255 s at p50, its last row at about 0.16 s). ``watch`` wakes the loop at the end of
    any watched call. In-process: the server's ``Watched`` with a 60-s wait, and a real call (a pool's
    readiness) that begins during that wait and ends at once."""
    import threading

    import ray

    from raymodel.jobs._server.watched import Watched

    watched = Watched()
    ready: list[str] = []

    @ray.remote(num_cpus=0)
    def wait_ready() -> bool:
        return True

    loop = threading.Thread(target=watched.reap, args=(60.0,), daemon=True)
    loop.start()
    time.sleep(0.5)  # the loop is in its wait, watching nothing
    watched.watch(wait_ready.remote(), lambda ref: ready.append("pool-1"))
    loop.join(timeout=30)  # woken by the call's end, not by the wait's 60 s
    assert not loop.is_alive() and ready == ["pool-1"] and not watched.calls


def test_pruning_keeps_what_is_in_use_and_bounds_the_rest(tmp_path, monkeypatch):
    from raymodel._internal import tmp
    from raymodel.jobs._prune import limits_from_env, prune

    home, scratch = tmp_path / "home", tmp_path / "tmp"
    monkeypatch.setenv("RAYMODEL_HOME", str(home))
    monkeypatch.setattr(tmp, "root", lambda: scratch)
    now = time.time()

    def entry(path: Path, mb: float, age_s: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"0" * int(mb * (1 << 20)))
        os.utime(path, (now - age_s, now - age_s))

    entry(home / "pools" / "pool-old" / "state.json", 0.1, 3 * 3600)  # ended long ago
    entry(home / "pools" / "pool-live" / "state.json", 0.1, 3 * 3600)  # old, but its pool runs
    entry(home / "pools" / "pool-a" / "big.bin", 3, 60)  # recent; the two are over the bound
    entry(home / "pools" / "pool-b" / "big.bin", 3, 30)
    entry(scratch / "whole" / "k1.pt", 3, 600)
    entry(scratch / "whole" / "k2.pt", 3, 60)
    entry(home / "jobs" / "train-done" / "payload.pkl", 0.1, 5)  # its job is done
    entry(home / "jobs" / "train-new" / "payload.pkl", 0.1, 5)  # being submitted: no record yet
    entry(home / "jobs" / "train-done.json", 0.01, 5)

    monkeypatch.setenv("RAYMODEL_PRUNE_AFTER_S", "3600")
    monkeypatch.setenv("RAYMODEL_PRUNE_MAX_MB", "4")
    gone = prune({"pool-live"}, {"train-done"}, limits_from_env())
    assert gone == {"pools": 2, "whole": 1, "jobs": 1}
    assert sorted(os.listdir(home / "pools")) == ["pool-b", "pool-live"]  # the oldest over the bound went
    assert os.listdir(scratch / "whole") == ["k2.pt"]
    assert sorted(os.listdir(home / "jobs")) == ["train-done.json", "train-new"]

    monkeypatch.setenv("RAYMODEL_PRUNE_MAX_MB", "lots")
    with pytest.raises(rm.exceptions.SettingsError, match="`RAYMODEL_PRUNE_MAX_MB` must be a number >= 0"):
        limits_from_env()


@lane.job("chaos", expected_s=480)
def _chaos(scratch: Path) -> list[dict]:
    from clusters import run_script

    env = {
        "RAYMODEL_HOME": str(scratch / "home"),
        "RAYMODEL_SERVER_FILE": str(scratch / "server.json"),
        "HOME": str(scratch),
        # Under load a clean-clone run's script died 60 s into a head restart, of Ray's limit on reaching
        # the GCS ("Failed to connect to GCS within 60 seconds"): Ray waits as long as the test lets the
        # head take to come back (300 s, asserted below).
        "RAY_gcs_rpc_server_reconnect_timeout_s": "300",
    }
    return run_script("chaos.py", ["0", "3"], env, timeout=1500)


@pytest.mark.integration
@pytest.mark.lane("chaos")
def test_chaos_a_queue_of_jobs_through_kills_of_the_server_a_worker_and_the_head(lane):
    """tests/chaos.py in its own process and head (``raymodel server start``, on the background lane): a
    head restart with a running and a queued job, then 3 kills, one of each, in a seeded random order at
    random moments (the server actor, a pool's worker, the head), under a queue of train, one-off, tune
    and stopped jobs."""
    head, chaos = lane.result("chaos")

    assert head["statuses"] == ["SUCCEEDED", "SUCCEEDED"], head
    running_log, queued_log = head["logs"]
    assert head["epochs"][0] == list(range(1, 7)) and head["epochs"][1] == [1, 2, 3]
    assert "the job server restarted while it ran (after epoch" in running_log
    assert running_log.count("epoch 1:") == 1, running_log  # resumed, not trained again from epoch 1
    assert "still queued, in its place" in queued_log
    assert head["back_s"] < 300, head  # the head is back and answering (a slow, busy machine: 64 s seen)

    jobs = chaos["jobs"]
    print("chaos:", json.dumps({k: chaos[k] for k in ("kills", "back_s")}), json.dumps(jobs))
    assert chaos["kills"] == {"server": 1, "worker": 1, "head": 1}, chaos["kills"]
    stopped = chaos["ids"][-1]
    for job_id, job in jobs.items():
        assert job["status"] == ("STOPPED" if job_id == stopped else "SUCCEEDED"), (job_id, job)
        assert job["epochs_once"], (job_id, job)
    assert sum(job["restarts"] for job in jobs.values()) >= 1  # the server took some of them through a restart
    assert sorted(chaos["listed"]) == sorted(set(chaos["listed"]))  # no record twice
    assert set(chaos["ids"]) <= set(chaos["listed"])  # and none lost
    assert chaos["left"] == [] and chaos["free_cpus"] == 2.0  # no job folder left, every CPU back


def test_a_job_record_written_before_the_records_were_typed_loads():
    """``tests/records/train-job-d4a7f0c.json``: a record as the server wrote it before ``JobRecord``
    (a job of 3 epochs, changed to 4 while it ran, on a pool of 1 worker). It loads with every field
    it held; a mid-run record of that server (a preemption under way under its old key ``preempt_by``,
    workers lost) loads too, and the stored form of what loaded loads again the same."""
    import json

    from raymodel.jobs._server.records import JobRecord, Lost

    stored = json.loads((Path(__file__).parent / "records" / "train-job-d4a7f0c.json").read_text())
    record = JobRecord.from_dict(stored)
    assert (record.id, record.kind, record.status, record.epochs) == (stored["id"], "train", "SUCCEEDED", 4)
    assert record.needs == {"CPU": 1.0} and record.pool_key == "torch/1x[CPU=1]" and record.pool_id
    assert [row["epoch"] for row in record.history] == [1, 2, 3, 4] and record.last_epoch == 4
    assert record.changes[0]["settings"] == {"num_epochs": 4} and record.changes[0]["epoch"] == 1
    assert record.result["checkpoint"] and record.log == stored["log"] and record.durable
    assert record.as_dict() == {**stored, **{k: v for k, v in record.as_dict().items() if k not in stored}}

    running = {**stored, "status": "RUNNING", "preempt_by": "train-20261207-170000-abcdef", "stopping": True}
    running["lost"] = {"at": 1796662560.0, "epoch": 2, "rows": 2, "nodes": ["a1b2"]}
    record = JobRecord.from_dict(running)
    assert record.active and record.preempting == "train-20261207-170000-abcdef" and record.stopping
    assert record.lost == Lost(at=1796662560.0, epoch=2, rows=2, nodes=["a1b2"])
    assert JobRecord.from_dict(json.loads(json.dumps(record.as_dict()))) == record
