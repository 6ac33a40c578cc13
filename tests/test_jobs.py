"""The training server: jobs that run without the caller, on the session's real Ray."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lane
import pytest
import requests
import torch
from models import SlowNet, TinyNet
from waiting import until

import raymodel as rm
from raymodel.exceptions import TrainingError

TESTS = str(Path(__file__).parent)
PYTHON = sys.executable


def _free_cpus(ray):
    return ray.available_resources().get("CPU", 0.0)


@pytest.mark.integration
def test_a_job_returns_at_once_streams_and_stops_with_a_checkpoint_and_its_cpus_back(ray_session, tiny_data):
    rm.jobs.release_pools()  # the pools of earlier tests
    every = ray_session.cluster_resources()["CPU"]
    assert until(lambda: _free_cpus(ray_session) == every), "an earlier test's actors still hold CPUs"
    start = time.monotonic()
    job = TinyNet().train({"num_workers": 1, "num_epochs": 200, "progress": False}, data=tiny_data, wait=False)
    assert time.monotonic() - start < 30 and job.kind == "train"  # margin: a loaded 2-core machine
    assert job.status in ("PENDING", "RUNNING")  # returned before its 200 epochs
    epochs = []
    for row in job.stream():
        epochs.append(row["epoch"])
        if len(epochs) == 2:
            break
    assert epochs == [1, 2]
    assert job.resources == {"CPU": 1.0}  # its worker group's placement group, from Ray's state API
    job.stop()
    result = job.wait(timeout=120)
    assert job.status == "STOPPED" and 2 <= len(result.history) < 200
    assert [row["epoch"] for row in result.history] == list(range(1, len(result.history) + 1))
    again = rm.RayModel.from_checkpoint(result.checkpoint)
    assert isinstance(again, TinyNet)
    assert job.resources == {} and "stopped" in job.logs()
    # Its pool stays, idle, for the next job that fits it, until it is released (or idle too long).
    assert [(p.state, p.resources) for p in rm.jobs.pools()] == [("idle", {"CPU": 1.0})]
    rm.jobs.release_pools()
    assert rm.jobs.pools() == []
    assert until(lambda: _free_cpus(ray_session) == every), "the pool's CPUs were not given back"
    listed = {j.id: j for j in rm.jobs.list()}
    assert isinstance(listed[job.id], rm.jobs.Job) and listed[job.id].summary["status"] == "STOPPED"
    assert listed[job.id].status == "STOPPED"


@pytest.mark.integration
def test_jobs_that_fit_run_together_and_one_that_does_not_waits_then_runs(ray_session, tiny_data):
    one = {"num_workers": 1, "num_epochs": 200, "progress": False}
    a = TinyNet().train(one, data=tiny_data, wait=False)
    b = TinyNet().train(one, data=tiny_data, wait=False)
    big = TinyNet().train({"num_workers": 2, "num_epochs": 2, "progress": False}, data=tiny_data, wait=False)
    until(lambda: len(a.history()) >= 1 and len(b.history()) >= 1)  # both train at the same time
    assert a.status == b.status == "RUNNING"
    assert big.status == "PENDING" and big.reason.startswith("waiting for CPU: needs 2")
    a.stop(), b.stop()

    async def epochs_of(job):  # the async stream: through PENDING, RUNNING, to the end
        return [row["epoch"] async for row in job.stream()]

    assert asyncio.run(asyncio.wait_for(epochs_of(big), timeout=240)) == [1, 2]
    # A stream that saw the job end holds its final record: `wait()` returns it without asking the server.
    server, big._server = big._server, None
    result = big.wait(timeout=240)
    big._server = server
    assert big.status == "SUCCEEDED" and [r["epoch"] for r in result.history] == [1, 2]
    again = next(j for j in rm.jobs.list() if j.id == big.id)  # another handle, the plain stream
    assert [row["epoch"] for row in again.stream()] == [1, 2]
    again._server = None
    assert again.wait().history == result.history
    assert a.status == b.status == "STOPPED"

    never = TinyNet().train({"num_workers": 8, "num_epochs": 1, "progress": False}, data=tiny_data, wait=False)
    assert never.status == "FAILED"
    with pytest.raises(TrainingError, match="can never run on this cluster: it needs 8 CPU"):
        never.wait()


class Exploding(TinyNet):
    def train_step(self, batch):
        raise RuntimeError("the loss exploded")


@pytest.mark.integration
def test_a_failed_job_raises_the_workers_own_error(ray_session, tiny_data, monkeypatch):
    # Two workers: on the idle pool the last test's two-worker job left.
    job = Exploding().train({"num_workers": 2, "num_epochs": 2, "progress": False}, data=tiny_data, wait=False)
    with pytest.raises(TrainingError, match="RuntimeError: the loss exploded"):
        job.wait(timeout=120)
    assert job.status == "FAILED"
    assert "RuntimeError: the loss exploded" in job.error and job.reason is None  # why, without logs() or wait()
    assert repr(job).startswith(f"Job(id={job.id!r}, kind='train', status='FAILED', error=") and "exploded" in repr(job)
    import contextlib
    import io

    import ray

    from raymodel.cli import main

    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)  # `raymodel jobs list` joins it
    listed = io.StringIO()
    with contextlib.redirect_stdout(listed):
        assert main(["jobs", "list"]) == 0
    row = next(line for line in listed.getvalue().splitlines() if line.startswith(job.id))
    assert "FAILED (" in row and "the loss exploded" in row, row


@pytest.mark.integration
def test_a_stopped_tune_job_stops_every_trial_and_keeps_the_best_so_far(ray_session, tiny_data):
    job = TinyNet().tune(
        {"lr": rm.tune.grid_search([0.01, 0.02])},
        data=tiny_data,
        wait=False,
        settings={
            "num_samples": 1,
            "max_epochs": 200,
            "scheduler": "fifo",
            "progress": False,
            "train": {"resources_per_worker": {"CPU": 0.95}, "progress": False},
        },
    )
    assert job.kind == "tune"
    epochs: dict[str, int] = {}
    for row in job.stream():
        epochs[row["trial_id"]] = row["epoch"]
        if len(epochs) == 2 and min(epochs.values()) >= 2:  # both trials are past their second epoch
            break
    assert job.resources == {"CPU": 1.9}  # both trials' placement groups, from Ray's state API
    job.stop()
    result = job.wait(timeout=180)
    assert job.status == "STOPPED" and result.num_trials == 2
    assert all(2 <= t["epochs"] < 200 for t in result.trials)
    assert rm.RayModel.from_checkpoint(result.best_checkpoint).config["lr"] == result.best_config["lr"]
    assert until(lambda: _free_cpus(ray_session) == 2.0)


class DictNet(SlowNet):
    """``SlowNet`` on a ``ray.data`` Dataset's dict batches."""

    def train_step(self, batch):
        time.sleep(self.config["step_s"])
        return torch.nn.functional.cross_entropy(self(batch["x"]), batch["y"])


@pytest.mark.integration
def test_the_server_killed_mid_job_comes_back_resumes_the_running_job_and_keeps_the_queue(
    ray_session, tiny, tiny_data, caplog
):
    import ray.data

    from raymodel.jobs._address import NAME, NAMESPACE

    one = {"num_workers": 1, "batch_size": 16, "progress": False}
    running = SlowNet().train({**one, "num_epochs": 8}, data=tiny_data, wait=False)
    queued = SlowNet().train({**one, "num_workers": 2, "num_epochs": 2}, data=tiny_data, wait=False)  # 1 CPU free
    X, y = tiny
    items = [{"x": X[i], "y": int(y[i])} for i in range(len(X))]
    with caplog.at_level("WARNING", logger="raymodel"):
        fleeting = DictNet().train({**one, "num_epochs": 2}, data={"train": ray.data.from_items(items)}, wait=False)
    assert running.durable and queued.durable and not fleeting.durable
    notice = [r.getMessage() for r in caplog.records if r.name == "raymodel"]
    assert len(notice) == 1 and fleeting.id in notice[0] and "'train' split is a `ray.data` Dataset" in notice[0]
    until(lambda: len(running.history()) >= 3, 180)
    assert queued.status == "PENDING" and fleeting.status == "PENDING"

    killed = time.monotonic()
    ray_session.kill(ray_session.get_actor(NAME, namespace=NAMESPACE), no_restart=False)  # Ray restarts it
    rm.jobs.list()  # the restarted actor answers, from its records in storage
    assert time.monotonic() - killed < 60  # a new worker process: margin for a loaded machine
    result = running.wait(timeout=240)  # this handle rides through the restart
    assert [row["epoch"] for row in result.history] == list(range(1, 9))
    log = running.logs()
    assert "the job server restarted while it ran (after epoch" in log and "again, from its newest checkpoint" in log
    assert log.count("epoch 1:") == 1, log  # resumed from its checkpoint: epoch 1 was not trained again
    try:
        assert [row["epoch"] for row in queued.wait(timeout=240).history] == [1, 2]  # kept in the queue, then run
    except TimeoutError:
        groups = ray_session.util.placement_group_table()
        print(queued.logs(), rm.jobs.pools(), ray_session.available_resources(), groups)
        raise
    assert "still queued, in its place" in queued.logs()
    with pytest.raises(TrainingError, match="could not be kept: its 'train' split is a `ray.data` Dataset"):
        fleeting.wait(timeout=60)
    rm.jobs.release_pools()
    assert until(lambda: _free_cpus(ray_session) == 2.0), "a run lost with the server still holds CPUs"


@pytest.mark.integration
def test_the_server_removes_the_placement_groups_whose_maker_died_and_keeps_the_others(ray_session):
    """A Train controller killed while its worker group waits to be placed (a job stopped while it
    waits for a lost node) leaves that group: Ray keeps it while the job that made it lives, and it
    would take the node's CPUs the moment the node returns. Here an actor of the server's job (this
    driver's, which started the server) stands in for the controller."""
    from ray.util.placement_group import PlacementGroup, placement_group

    from raymodel.jobs._server.recovery import orphaned_groups

    @ray_session.remote(num_cpus=0)
    class Maker:
        def make(self, bundle: dict[str, float]) -> str:
            self.group = placement_group([bundle])
            return self.group.id.hex()

    def state(group: str) -> str:
        return ray_session.util.placement_group_table()[group]["state"]

    rm.jobs.list()  # the server runs
    doomed, kept = Maker.remote(), Maker.remote()
    waiting = ray_session.get(doomed.make.remote({"CPU": 64.0}))  # more than any node: it waits
    placed = ray_session.get(doomed.make.remote({"CPU": 0.5}))
    alive = ray_session.get(kept.make.remote({"CPU": 64.0}))
    mine = placement_group([{"CPU": 64.0}])  # the driver's own: Ray says its creator is dead too
    job = ray_session.get_runtime_context().get_job_id()
    try:
        assert until(lambda: state(placed) == "CREATED")
        assert not {waiting, placed, alive, mine.id.hex()} & set(orphaned_groups(job))
        ray_session.kill(doomed)
        assert until(lambda: state(waiting) == state(placed) == "REMOVED", 60), "the server left them"
        assert state(alive) == state(mine.id.hex()) == "PENDING"
        assert not {alive, mine.id.hex()} & set(orphaned_groups(job))
    finally:
        ray_session.kill(kept)
        for group in (waiting, placed, alive, mine.id.hex()):
            ray_session.util.remove_placement_group(PlacementGroup(ray_session.PlacementGroupID.from_hex(group)))


def test_a_group_whose_maker_died_is_removed_even_where_ray_did_not_mark_its_maker_dead():
    """Ray's mark on a group whose maker died (``creator_actor_dead``) can be missing: a pool's Train
    controller that died with its pool left its group CREATED and unmarked, holding both CPUs, and the
    next job waited for ever. The sweep asks the actor table about a group's maker too (Ray's own rows
    here, in-process: the case cannot be made on demand)."""
    from ray.core.generated.gcs_pb2 import PlacementGroupTableData as Group

    from raymodel.jobs._server.recovery import orphans

    job, other = bytes.fromhex("01000000"), bytes.fromhex("02000000")
    live, dead = bytes(range(12)) + job, bytes(range(1, 13)) + job
    groups = {
        "unmarked, maker dead": Group(creator_actor_id=dead, creator_actor_dead=False),
        "marked dead": Group(creator_actor_id=live, creator_actor_dead=True),
        "maker alive": Group(creator_actor_id=live),
        "the driver's (no maker)": Group(creator_actor_id=b"\xff" * 16, creator_actor_dead=True),
        "another job's": Group(creator_actor_id=dead, creator_job_id=other),
        "removed": Group(creator_actor_id=dead, state=Group.REMOVED),
        "detached": Group(creator_actor_id=dead, is_detached=True),
    }
    for i, (name, group) in enumerate(groups.items()):
        group.placement_group_id = bytes([i]) * 18
        group.state = group.state if name == "removed" else Group.CREATED
        if not group.creator_job_id:
            group.creator_job_id = job
    found = orphans(list(groups.values()), job.hex(), lambda actor: actor == dead)
    assert sorted(found) == sorted(groups[n].placement_group_id.hex() for n in ("unmarked, maker dead", "marked dead"))


SUBMIT = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np, raymodel as rm
import torch
from models import SlowNet, TinyNet
rng = np.random.default_rng(0)
X = rng.normal(size=(32, 4)).astype(np.float32)
rm.init()  # attaches to `raymodel server start`
job = TinyNet().train({{"num_workers": 1, "num_epochs": 3, "progress": False}},
                      data=rm.data.from_numpy(X, (X[:, 0] > 0).astype(np.int64)), wait=False)
print(job.id)
"""

#: The class names of the head's live actors, from a process that attaches to `raymodel server start`
#: having imported Ray before raymodel, as a user may (`rm.init` must still join in token mode); then
#: Train's report poll interval in the head's processes (a task's: they inherit the head's environment).
ACTORS = """
import os, ray, raymodel as rm
from ray.util.state import list_actors
rm.init()
address = ray.get_runtime_context().gcs_address  # this head's, with the test session's Ray beside it
print(sorted({a.class_name for a in list_actors(address, filters=[("state", "=", "ALIVE")], limit=10_000)}))
print(ray.get(ray.remote(num_cpus=0)(lambda: os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")).remote()))
"""


SUBMIT_SLOW = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np, raymodel as rm
from models import SlowNet
rng = np.random.default_rng(0)
X = rng.normal(size=(32, 4)).astype(np.float32)
rm.init()  # attaches to `raymodel server start`
job = SlowNet(config={{"step_s": 0.3}}).train(
    {{"num_workers": 1, "num_epochs": 6, "batch_size": 4, "progress": False}},
    data=rm.data.from_numpy(X, (X[:, 0] > 0).astype(np.int64), valid_fraction=0.0), wait=False)
next(iter(job.stream()))  # its first epoch's row: the job is in its second epoch (8 steps of 0.3 s each)
print(job.id)
"""


def test_server_stop_ends_what_the_heads_processes_started_whose_command_lines_do_not_name_it():
    """``raymodel server stop`` finds a head's processes by its folder in their command lines; Ray's workers
    (retitled ``ray::...``) and the dashboard's module processes do not name it, and under load one can
    outlive its parent's end for a while, then reach a head started again on the same port. The stop ends
    what the head's processes started too (``with_descendants``), found before any ends."""
    from raymodel.cli._stop import _running, start_times, terminate, with_descendants

    tree = subprocess.Popen(["sh", "-c", "sleep 60 & (sleep 60; true) & wait"])  # a child; a grandchild

    def parents() -> dict[int, tuple[int, str]]:
        out = subprocess.run(["ps", "-eo", "pid=,ppid=,comm="], capture_output=True, text=True).stdout
        return {int(p): (int(pp), name) for p, pp, name in (line.split(None, 2) for line in out.splitlines())}

    try:
        found = until(lambda: (lambda f: len(f) >= 4 and f)(with_descendants([tree.pid])), 10)
        table = parents()
        assert found[0] == tree.pid and os.getpid() not in found
        sleeps = [pid for pid in found if table[pid][1].strip() == "sleep"]
        assert len(sleeps) == 2 and {table[pid][0] for pid in sleeps} - {tree.pid}, table  # one is a grandchild
        began = start_times(found)
        assert sorted(began) == sorted(found)
        assert terminate(found, wait_s=5) == []  # all ended at SIGTERM
        assert not [pid for pid in found if _running(pid)]
        tree.wait(timeout=5)
        assert start_times([tree.pid]) == {}  # ended and collected: no start time to match a new process by
        deaf = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"])  # what outlived a head: killed
        time.sleep(0.3)
        assert [pid for pid, _ in terminate([deaf.pid], wait_s=0.0, gently=False)] == [deaf.pid]
        assert deaf.wait(timeout=5) == -9
    finally:
        for process in (tree, *([deaf] if "deaf" in locals() else [])):
            process.kill()
            process.wait()


@lane.job("server_start", expected_s=180)
def _server_start(scratch: Path) -> dict[str, Any]:
    """`raymodel server start`, a job submitted by a process that then exits, and the CLI and the
    dashboard of other processes on it, then `server stop`: what each step answered (on the lane)."""
    from s3server import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYMODEL_", "PYTHONBREAKPOINT"))}
    env.update({"RAYMODEL_SERVER_FILE": str(scratch / "server.json"), "RAYMODEL_HOME": str(scratch / "home")})
    cli = [PYTHON, "-m", "raymodel.cli"]
    run = lambda *a: subprocess.run([*cli, *a], env=env, capture_output=True, text=True, timeout=300)  # noqa: E731
    steps: dict[str, Any] = {}
    try:
        ports = ("--port", str(free_port()), "--dashboard-port", str(free_port()))
        # A warm pool of the submitted job's size, waited for: the job finds it ready.
        steps["started"] = run("server", "start", *ports, "--num-cpus", "2", "--warm", "torch:1", "--wait")
        if steps["started"].returncode != 0:
            return steps
        steps["warmed"] = run("server", "status")
        steps["submitted"] = submitted = subprocess.run(
            [PYTHON, "-c", SUBMIT.format(tests=TESTS)], env=env, capture_output=True, text=True, timeout=300
        )
        if submitted.returncode != 0:
            return steps
        steps["job_id"] = job_id = submitted.stdout.strip().splitlines()[-1]  # the submitter has exited
        steps["waited"] = run("jobs", "wait", job_id)
        steps["listed"] = run("jobs", "list")
        steps["late"] = run("jobs", "update", job_id, "--set", "lr=0.1", "--set", "num_epochs=5")
        steps["nothing"] = run("jobs", "update", job_id)
        steps["status"] = run("server", "status")  # the job's pool stays, idle, for the next job
        steps["actors"] = subprocess.run([PYTHON, "-c", ACTORS], env=env, capture_output=True, text=True, timeout=300)
        steps["logs"] = run("jobs", "logs", job_id)
        steps["missing"] = run("jobs", "show", "no-such-job")
        steps["record"] = (scratch / "home" / "jobs" / f"{job_id}.json").exists()  # it outlives everyone
        dashboard = subprocess.Popen(
            [*cli, "dashboard", "--port", str(free_port())],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            steps["url"] = url = dashboard.stdout.readline().split()[-1]  # "raymodel dashboard: http://...?token="
            steps["shown"] = requests.get(url.split("?")[0] + "api/jobs", timeout=60).json()
        finally:
            dashboard.terminate()
            dashboard.wait(timeout=30)
        # `server stop` with a job in the middle of an epoch: the epoch ends, a checkpoint is written, and
        # the next `server start` (on the same storage) resumes the job from there.
        steps["slow"] = slow = subprocess.run(
            [PYTHON, "-c", SUBMIT_SLOW.format(tests=TESTS)], env=env, capture_output=True, text=True, timeout=300
        )
        if slow.returncode != 0:
            return steps
        steps["slow_id"] = slow_id = slow.stdout.strip().splitlines()[-1]
        steps["drained"] = run("server", "stop", "--grace-s", "60")
        steps["restarted"] = run("server", "start", *ports, "--num-cpus", "2")
        steps["resumed"] = run("jobs", "wait", slow_id)
        steps["slow_logs"] = run("jobs", "logs", slow_id)
        steps["slow_record"] = json.loads(run("jobs", "show", slow_id).stdout)
    finally:
        steps["stopped"] = run("server", "stop")
        steps["after"] = run("jobs", "list")
        # what `ray start --head` left that names the head only by its port: its Ray Client server
        listed = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
        steps["left"] = [x for x in listed if "ray.util.client.server" in x and f":{ports[1]} " in x]
    return steps


@pytest.mark.integration
@pytest.mark.lane("server_start")
def test_a_job_submitted_by_one_process_is_awaited_by_another_after_server_start(lane):
    steps = lane.result("server_start")
    started, submitted = steps["started"], steps.get("submitted")
    assert started.returncode == 0, started.stderr[-2000:]
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    job_id, waited, listed = steps["job_id"], steps["waited"], steps["listed"]
    assert waited.returncode == 0 and f"{job_id} SUCCEEDED" in waited.stdout, waited.stderr[-2000:]
    assert job_id in listed.stdout and "SUCCEEDED" in listed.stdout
    assert listed.stdout.split()[:5] == ["ID", "KIND", "PRIORITY", "STATUS", "ETA"]
    late = steps["late"]
    assert late.returncode == 2 and "is SUCCEEDED: a finished job cannot change" in late.stderr, late.stderr
    assert steps["nothing"].returncode != 0  # nothing to change
    # `--wait`: the start returned once its warm pool was ready (idle, not "warming for"), and the job took it
    assert re.search(r"warm pools ready: torch:1 \(\d+\.\d s\)", started.stdout), started.stdout
    warmed = steps["warmed"].stdout
    assert re.search(r"torch/1x\[CPU=1\]\s+holds 1 CPU\s+idle \d+ s\s+jobs run 0\s+warm", warmed), warmed
    status = steps["status"].stdout
    assert "jobs: 1 SUCCEEDED" in status and "pools: 1" in status, status
    assert re.search(r"torch/1x\[CPU=1\]\s+holds 1 CPU\s+idle \d+ s\s+jobs run 1\s+warm", status), status
    assert "epoch 3" in steps["logs"].stdout
    # The head runs no autoscaler, so nothing drains it: its pool's worker group has no preemption watcher.
    actors = steps["actors"]
    assert actors.returncode == 0 and "RayTrainWorker" in actors.stdout, (actors.stdout, actors.stderr[-2000:])
    assert "PreemptionWatcher" not in actors.stdout, actors.stdout
    # Its runs poll their workers' reports every 0.2 s, not Train's 2 s (a report can wait for a poll).
    assert actors.stdout.strip().splitlines()[-1] == "0.2", actors.stdout
    missing = steps["missing"]
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "No job `no-such-job`" in missing.stderr
    assert steps["record"]
    assert steps["url"].startswith("http://127.0.0.1:") and "?token=" in steps["url"]
    assert [j["status"] for j in steps["shown"] if j["id"] == job_id] == ["SUCCEEDED"]
    assert steps["stopped"].returncode == 0 and "stopped" in steps["stopped"].stdout
    assert steps["left"] == [], steps["left"]  # the head's Ray Client server ended with it
    assert steps["after"].returncode == 1  # no server: one line, exit 1

    # `server stop` let the running job end its epoch and checkpoint; the next head resumed it there
    slow, drained = steps["slow"], steps["drained"]
    assert slow.returncode == 0, slow.stderr[-2000:]
    slow_id = steps["slow_id"]
    assert drained.returncode == 0, drained.stderr[-2000:]
    said = re.search(rf"{slow_id}: checkpointed after epoch (\d+);", drained.stdout)
    assert said and "running job(s) to end their epoch" in drained.stdout, drained.stdout
    assert re.search(r"stopped the raymodel server at \S+: \d+ process\(es\) ended", drained.stdout), drained.stdout
    checkpointed = int(said.group(1))
    assert checkpointed >= 2, drained.stdout  # the epoch in progress at the stop (the second) was finished
    assert steps["restarted"].returncode == 0, steps["restarted"].stderr[-2000:]
    assert steps["resumed"].returncode == 0 and f"{slow_id} SUCCEEDED" in steps["resumed"].stdout
    record, log = steps["slow_record"], steps["slow_logs"].stdout
    assert record["status"] == "SUCCEEDED" and record["history_rows"] == 6, record
    assert f"preempted by `raymodel server stop` after epoch {checkpointed}" in log, log
    assert "again, from its newest checkpoint" in log, log
    for epoch in range(1, 7):  # each epoch trained once: none again from scratch after the restart
        assert len(re.findall(rf"\bepoch {epoch}:", log)) == 1, (epoch, log)


def test_a_head_whose_raylet_ended_is_said_so_at_once_and_stop_ends_it_without_waiting(tmp_path):
    """A head whose GCS runs but whose raylet ended (killed, out of memory: a zombie, its parent gone)
    takes no one: ``ray.init`` tried for a minute, then failed naming an address of the machine's own
    (``server status``, ``stop``'s drain, ``rm.init()``: 60-64 s each on such a head). Each now says what
    is wrong before touching Ray (fresh processes: this one's Ray may run)."""
    import psutil

    from raymodel._ray.cluster import head_problem

    # Ended but not reaped, as a killed raylet stays when the `ray start` that started it is gone.
    ended = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ended.kill()
    until(lambda: psutil.Process(ended.pid).status() == psutil.STATUS_ZOMBIE, 10)
    gcs = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a GCS that runs
    server = tmp_path / "server.json"
    info = {"address": "127.0.0.1:1", "temp_dir": str(tmp_path / "head"), "gcs_pid": gcs.pid}
    server.write_text(json.dumps({**info, "raylet_pid": ended.pid}))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAYMODEL_SERVER_FILE": str(server)}
    said = f"its raylet (pid {ended.pid}) has ended while its GCS (pid {gcs.pid}) runs"
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=60
    )
    try:
        began = time.monotonic()
        status = run("-m", "raymodel.cli", "server", "status")
        assert status.returncode == 1 and said in status.stdout
        joined = run("-c", "import raymodel as rm; rm.init()")
        assert said in joined.stderr and "`raymodel server stop` ends what is left of it" in joined.stderr
        started = run("-m", "raymodel.cli", "server", "start")
        assert started.returncode == 1 and said in started.stderr  # not "already running"
        stopped = run("-m", "raymodel.cli", "server", "stop")
        assert stopped.returncode == 0 and "stopping without waiting" in stopped.stdout, stopped.stdout
        assert "did not answer" not in stopped.stdout and not server.exists()
        assert time.monotonic() - began < 40  # four processes' imports; each was a minute and more
    finally:
        gcs.kill()
        ended.wait()
    assert head_problem(info) is None  # an older raymodel's file names no raylet: nothing to say
    assert head_problem({**info, "raylet_pid": os.getpid()}) is None  # a raylet that runs
