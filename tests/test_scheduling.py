"""Scheduling and control: priorities and preemption, ``job.update``, ``job.eta``, elastic runs and
runs that lose a node.

The queue policy and the checks of an update are unit-tested without a cluster;
the rest runs on the session's real Ray (2 CPUs), and the node losses in a
cluster of their own (``tests/nodeloss.py``, ``ray.cluster_utils.Cluster``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import lane
import pytest
from clusters import run_script
from conformance import CrashOnce
from models import TinyNet
from waiting import until

import raymodel as rm
from raymodel.cli._jobs import parse_changes
from raymodel.exceptions import SettingsError
from raymodel.jobs._server.control import _check_update
from raymodel.jobs._server.queue import choose_victims, etas, queue_order
from raymodel.jobs._server.records import JobRecord

TESTS = os.path.dirname(__file__)
BASE = {"num_workers": 2, "batch_size": 4, "progress": False}


def _job(id, status="RUNNING", priority=0, cpus=2.0, submitted=0.0, started=0.0, **more):
    needs = {"CPU": cpus}
    return JobRecord(id, "train", status, priority=priority, needs=needs, submitted=submitted, started=started, **more)


# ------------------------------------------------------------------ policy
def test_the_queue_orders_by_priority_then_submission():
    jobs = [
        _job("a", "PENDING", 0, submitted=1),
        _job("b", "PENDING", 5, submitted=3),
        _job("c", "PENDING", 0, submitted=2),
        _job("d", "PENDING", 5, submitted=4),
        _job("e", "RUNNING", 9),
    ]
    assert [j.id for j in queue_order(jobs)] == ["b", "d", "a", "c"]


def test_preemption_takes_the_fewest_lowest_priority_jobs_and_never_an_equal_one():
    low_old = _job("low-old", priority=0, cpus=1, started=1)
    low_new = _job("low-new", priority=0, cpus=1, started=2)
    mid = _job("mid", priority=3, cpus=1, started=0)
    keep = _job("keep", priority=0, cpus=1, started=3, preemptible=False)
    running = [low_old, low_new, mid, keep]
    victims, enough = choose_victims(_job("hi", "PENDING", 5, cpus=1), running, {"CPU": 0.0})
    assert [v.id for v in victims] == ["low-new"] and enough  # the least work lost
    victims, enough = choose_victims(_job("hi", "PENDING", 5, cpus=3), running, {"CPU": 0.0})
    assert [v.id for v in victims] == ["low-new", "low-old", "mid"] and enough
    victims, enough = choose_victims(_job("hi", "PENDING", 5, cpus=5), running, {"CPU": 0.0})
    assert not enough  # the one that is not preemptible stays: not enough, so nobody is preempted
    _, enough = choose_victims(_job("eq", "PENDING", 3, cpus=2), [mid], {"CPU": 1.0})
    assert not enough  # equal priorities queue
    trial = _job("trial-job", priority=0, cpus=1, started=5, trial_id="t1")  # a tune job's trial: one by one
    tune = dataclasses.replace(_job("tune-job", priority=0, cpus=0.01), kind="tune")  # holds no workers itself
    victims, _ = choose_victims(_job("hi", "PENDING", 5, cpus=1), [tune, trial, low_old], {"CPU": 0.0})
    assert [v.id for v in victims] == ["trial-job"]
    being = _job("going", priority=0, cpus=2, preempting="hi")
    victims, enough = choose_victims(_job("hi", "PENDING", 5, cpus=2), [being, low_old], {"CPU": 0.0})
    assert victims == [] and enough  # one already on its way out is counted, not preempted again


def test_eta_plays_the_queue_forward_from_epoch_times():
    now = 100.0
    running = _job("r", started=80.0, epochs=10, history=[{"epoch": e} for e in range(1, 5)])
    times = {"r": [82.0, 84.0, 86.0, 88.0]}  # 2 s an epoch, 6 epochs left, 12 s since the last row
    first = _job("p1", "PENDING", submitted=1)
    second = _job("p2", "PENDING", submitted=2)
    small = _job("p3", "PENDING", cpus=0, submitted=3)
    out = etas([running, first, second, small], {"CPU": 0.0}, lambda i: times.get(i, []), now)
    assert out["r"] == pytest.approx(0.0)  # 12 s left at 2 s an epoch, and 12 s since the last row
    out = etas([running, first, second], {"CPU": 0.0}, lambda i: times.get(i, []), 90.0)
    assert out["r"] == pytest.approx(10.0) and out["p1"] == pytest.approx(10.0)
    assert out["p2"] is None  # behind a job whose own end is not known yet
    assert etas([first], {"CPU": 2.0}, lambda i: [], now)["p1"] == 0.0
    times["r"] = [82.0, 84.0, 89.0, 91.0]  # one slow epoch (5 s) among 2 s ones: the median is 2 s
    assert etas([running], {"CPU": 0.0}, lambda i: times.get(i, []), 91.0)["r"] == pytest.approx(12.0)


def test_an_update_is_checked_before_it_is_recorded():
    record = _job("j", history=[{"epoch": 1}, {"epoch": 2}, {"epoch": 3}], pool_key="torch/2x[CPU=1]")
    assert _check_update(record, {"lr": 1e-3}, {"num_epochs": 9, "keep_checkpoints": 2}) is None
    assert "`batch_size`" in _check_update(record, {}, {"batch_size": 8})
    assert "below the 3 epoch(s)" in _check_update(record, {}, {"num_epochs": 2})
    assert "Nothing to change" in _check_update(record, {}, {})
    assert "plain data" in _check_update(record, {"lr": object()}, {})
    assert "SUCCEEDED" in _check_update(dataclasses.replace(record, status="SUCCEEDED"), {"lr": 1.0}, {})
    one_off = dataclasses.replace(record, pool_key=None)
    assert "fixed when its run started" in _check_update(one_off, {}, {"keep_checkpoints": 1})
    assert parse_changes(["lr=1e-4", "num_epochs=40", "name=big"]) == (
        {"lr": 1e-4, "name": "big"},
        {"num_epochs": 40},
    )


def test_a_priority_that_is_no_whole_number_is_refused():
    with pytest.raises(SettingsError, match="priority"):
        rm.TrainSettings(priority=1.5)


def test_an_elastic_range_is_checked_up_front(tiny_data):
    assert rm.TrainSettings(num_workers=[1, 4]).num_workers == (1, 4)
    with pytest.raises(SettingsError, match=r"1 <= min <= max"):
        rm.TrainSettings(num_workers=(3, 2))
    with pytest.raises(SettingsError, match="elastic ranges are for `model.train`"):
        rm.TuneSettings(train={"num_workers": (1, 2)})
    import raymodel.backends.xgboost as xgb

    class Trees(xgb.RayXGBoostModel):
        def setup(self, config):
            self.params = {"objective": "binary:logistic"}

    with pytest.raises(SettingsError, match="fixed number of workers"):
        Trees().train({"num_workers": (1, 2)}, data=tiny_data, wait=False)


# ------------------------------------------------------------- on Ray
class Paced(rm.Callback):
    """Epochs of about ``seconds``; with ``hold``, epoch ``at`` waits until the file ``hold`` exists."""

    def __init__(self, seconds=0.3, hold=None, at=0):
        self.seconds, self.hold, self.at = seconds, hold, at

    def after_epoch(self, epoch, metrics):
        time.sleep(self.seconds)
        while self.hold and epoch == self.at and not os.path.exists(self.hold):
            time.sleep(0.05)


class LrNet(TinyNet):
    """Every worker writes the lr its optimizer holds at each epoch (``config["folder"]``)."""

    def after_epoch(self, epoch, metrics):
        lr = self._optimizers[0].param_groups[0]["lr"]
        Path(self.config["folder"], f"{self.context.rank}-{epoch}").write_text(json.dumps(lr))


class Updates(rm.Callback):
    """Every worker writes each config change ``on_config_update`` gave it."""

    def __init__(self, folder):
        self.folder = folder

    def on_config_update(self, changes):
        name = f"update-{self.context.rank}-{time.monotonic_ns()}"
        Path(self.folder, name).write_text(json.dumps(changes))


def _pending_reason(job):
    record = job._record()
    return record["status"] == "PENDING" and record["reason"]


def _epochs(job):
    return [row["epoch"] for row in job.history()]


@pytest.mark.integration
@pytest.mark.beside  # mostly waits: in the second session, while this one computes (tests/beside.py)
def test_a_higher_priority_job_preempts_and_the_preempted_one_resumes_with_each_epoch_once(ray_session, tiny_data):
    rm.jobs.release_pools()
    low = TinyNet().train({**BASE, "num_epochs": 6, "callbacks": [Paced()]}, data=tiny_data, wait=False)
    until(lambda: len(low.history()) >= 2, timeout=240)  # a cold pool, on a machine the suite saturates
    high = TinyNet().train({**BASE, "num_epochs": 2, "priority": 5}, data=tiny_data, wait=False)
    # Two of equal priority queue behind; neither preempts `low`. The first of them runs 12 epochs,
    # the second waits for it: its ETA is read once the first has three epoch times (their median).
    first = TinyNet().train({**BASE, "num_epochs": 12, "callbacks": [Paced(0.5)]}, data=tiny_data, wait=False)
    second = TinyNet().train({**BASE, "num_epochs": 1}, data=tiny_data, wait=False)
    reason = until(lambda: _pending_reason(low), 60, every=0.05)
    assert reason.startswith(f"preempted by {high.id}"), reason
    high.wait(timeout=120)
    low.wait(timeout=120)
    seen: dict[int, float] = {}  # how many rows `first` had -> when this process first saw that many

    def four_rows() -> bool:
        rows = len(first.history())
        seen.setdefault(rows, time.time())
        return rows >= 4 and first.status == "RUNNING" and len([n for n in seen if n >= 1]) >= 2  # a pace seen

    until(four_rows, 120, every=0.05)
    predicted, asked = second.eta, time.time()
    second.wait(timeout=180)
    records = {r["id"]: r for r in rm.jobs.records()}
    lo, hi, a, b = (records[j.id] for j in (low, high, first, second))

    assert _epochs(low) == [1, 2, 3, 4, 5, 6]  # each once: it resumed from its checkpoint
    log = low.logs()
    assert lo["preemptions"] == 1 and "again, from its newest checkpoint" in log
    stopped_at = int(log.split("after epoch ")[1].split(";")[0])
    assert 2 <= stopped_at < 6
    assert [row["epoch"] for row in low.wait().history] == [1, 2, 3, 4, 5, 6]  # the checkpoint's history
    assert hi["started"] < lo["ended"] and hi["ended"] <= a["started"]  # the high one ran in between
    assert lo["started"] < a["started"] < b["started"]  # then first in, first out
    assert a["preemptions"] == b["preemptions"] == 0
    # The ETA is `first`'s epochs left at its pace so far. Checked against that pace as seen here, not
    # against the wait that followed: on a machine shared with the suite, later epochs ran up to 4x slower
    # (predicted 4.6 s, waited 18.5 s in a clean-clone run), which no ETA can know when asked.
    counts = sorted(n for n in seen if n >= 1)
    rows, pace = counts[-1], (seen[counts[-1]] - seen[counts[0]]) / (counts[-1] - counts[0])  # two counts seen
    expected = (12 - rows) * pace - (asked - seen[rows])
    waited = b["started"] - asked
    assert predicted is not None and abs(predicted - expected) <= 0.5 * expected, (predicted, expected, waited)


@pytest.mark.integration
def test_update_changes_lr_on_every_worker_at_one_boundary_and_survives_a_worker_kill(ray_session, tiny_data, tmp_path):
    folder, hold = tmp_path / "lr", tmp_path / "go"
    folder.mkdir()
    crash = CrashOnce(str(tmp_path / "crash"), rank=1, epoch=6)
    settings = {
        **BASE,
        "num_epochs": 6,
        "max_failures": 1,
        "callbacks": [Paced(0.0, hold=str(hold), at=3), Updates(str(folder)), crash],
    }
    job = LrNet(config={"folder": str(folder)}).train(settings, data=tiny_data, wait=False)
    until(lambda: len(job.history()) >= 2)  # epoch 3 waits for `hold`: the change lands at its end
    with pytest.raises(SettingsError, match="`batch_size`"):
        job.update(settings={"batch_size": 8})
    with pytest.raises(SettingsError, match="below the 2 epoch"):
        job.update(settings={"num_epochs": 1})
    assert job.changes == []  # refused: untouched
    job.update(config={"lr": 0.004}, settings={"num_epochs": 8})
    hold.touch()
    result = job.wait(timeout=180)

    assert [row["epoch"] for row in result.history] == list(range(1, 9)) == _epochs(job)
    lrs = {(int(n.split("-")[0]), int(n.split("-")[1])): json.loads((folder / n).read_text()) for n in _names(folder)}
    for rank in (0, 1):
        assert [lrs[rank, e] for e in range(1, 9)] == [0.05] * 3 + [0.004] * 5, rank  # after the kill too
    assert job.changes == [{"epoch": 4, "config": {"lr": 0.004}, "settings": {"num_epochs": 8}}]
    assert result.history[3]["changes"] == {"lr": 0.004, "num_epochs": 8}
    assert "changes" not in result.history[4]
    assert (tmp_path / "crash").exists()  # rank 1 died at epoch 6 and the run resumed
    updates = [json.loads((folder / n).read_text()) for n in os.listdir(folder) if n.startswith("update-")]
    assert updates and all(u == {"lr": 0.004} for u in updates)
    assert rm.RayModel.from_checkpoint(result.checkpoint).config["lr"] == 0.004
    with pytest.raises(SettingsError, match="SUCCEEDED"):
        job.update(config={"lr": 1.0})


def _names(folder):
    return [n for n in os.listdir(folder) if not n.startswith("update-")]


# ------------------------------------------------------------ node loss
@lane.job("nodeloss", expected_s=300)
def _nodeloss(scratch: Path) -> list[dict]:
    env = {"RAYMODEL_HOME": str(scratch / "home"), "HOME": str(scratch)}
    return run_script("nodeloss.py", ["rescheduling", "elastic", "fixed", "stop_waiting", "give_up"], env, timeout=960)


@pytest.mark.integration
@pytest.mark.lane("nodeloss")
def test_an_elastic_run_shrinks_and_grows_and_a_fixed_one_says_what_it_waits_for_is_stopped_or_gives_up(lane):
    """Its own process and Ray cluster (on the background lane): a head with no CPUs and two 1-CPU worker
    nodes."""
    results = lane.result("nodeloss")
    seen = {r["scenario"]: r for r in results}
    rescheduling = seen["rescheduling"]  # Ray lists only the lost bundle of such a group
    assert rescheduling["waiting"] == [[[{"CPU": 1.0}], 2]], rescheduling
    assert rescheduling["said"] == "1 more CPU for 1 worker of 2", rescheduling
    elastic, fixed = seen["elastic"], seen["fixed"]
    epochs = [row["epoch"] for row in elastic["history"]]
    assert epochs == list(range(1, len(epochs) + 1))  # each once, shrunk and grown
    sizes = [row["world_size"] for row in elastic["history"]]
    runs = [size for i, size in enumerate(sizes) if i == 0 or size != sizes[i - 1]]
    assert runs == [2, 1, 2], sizes

    assert fixed["said_after"] < 60, fixed  # the server looks every 2 s (margin: a starved lane job)
    assert fixed["reason"].startswith("waiting for 1 more CPU for 1 worker of 2: node "), fixed["reason"]
    assert "lost at epoch 3" in fixed["reason"]
    assert fixed["while_waiting"] == ["RUNNING", 3]  # it waited, and did not fail or run on
    assert [row["epoch"] for row in fixed["history"]] == list(range(1, 9))  # resumed once a node came

    stopped = seen["stop_waiting"]  # stopped while it waits for a lost node: at once, not at an epoch's end
    assert stopped["status"] == "STOPPED" and stopped["took"] < 60, stopped  # left alone, it waits for good
    assert stopped["checkpoint"] and stopped["epochs"] >= 2, stopped

    give_up = seen["give_up"]  # resource_wait_s=4, and no node comes back
    assert "Waited 4 s for 1 more CPU for 1 worker of 2 (node " in (give_up["error"] or ""), give_up
    assert give_up["took"] < 60, give_up


def test_a_blocking_call_says_what_its_job_waits_for_again_at_most_every_repeat(monkeypatch, caplog):
    """``model.train()``'s wait loop, with a scripted job: the reason once at first, then again
    only after ``_REPEAT_S``; the pool's start once."""
    import io

    from raymodel.jobs import _blocking

    class Printer:
        label, stream = "TinyNet", io.StringIO()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    class Scripted:
        id = "train-1"

        def __init__(self):
            self.start = time.monotonic()

        def _record(self, until_done=0.0):
            time.sleep(0.02)
            age = time.monotonic() - self.start
            log = ["00:00:00 starting pool pool-1 of 2 torch worker(s)"]
            if age < 0.6:
                return {"status": "RUNNING", "reason": None, "log": log}
            if age < 1.2:
                return {"status": "RUNNING", "reason": LOST, "log": log}
            return {"status": "SUCCEEDED", "log": log}

    monkeypatch.setattr(_blocking, "_REPEAT_S", 0.25)
    monkeypatch.setattr(_blocking, "_QUIET_S", 0.0)
    printer = Printer()
    assert _blocking._await(Scripted(), printer)["status"] == "SUCCEEDED"
    lines = printer.stream.getvalue().splitlines()
    waits = [line for line in lines if "waiting for 1 more CPU" in line]
    assert lines[0] == "[TinyNet] starting a pool of 2 torch worker(s) (once: later runs reuse them)"
    assert sum("starting a pool" in line for line in lines) == 1
    assert 2 <= len(waits) <= 3 and set(waits) == {f"[TinyNet] {LOST}"}, lines  # 0.6 s of it, said each 0.25 s

    with caplog.at_level("WARNING", logger="raymodel"):  # progress=False: no printer, still said
        assert _blocking._await(Scripted(), None)["status"] == "SUCCEEDED"
    said = [r.getMessage() for r in caplog.records if r.name == "raymodel"]
    assert 2 <= len(said) <= 3 and set(said) == {f"raymodel: job train-1: {LOST}"}, said


LOST = "waiting for 1 more CPU for 1 worker of 2: node x lost at epoch 4"
