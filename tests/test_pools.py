"""Pools: the training server's resident worker groups, on the session's real Ray (2 CPUs)."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from conformance import CrashOnce
from models import PairDataset, TinyNet
from waiting import until

import raymodel as rm
from raymodel.exceptions import TrainingError

TWO = {"num_workers": 2, "num_epochs": 3, "batch_size": 4, "progress": False, "seed": 7}

#: Set by a job on a worker (a module global of the user's code): the next job must not see it.
LEAKED = None


def _pool_of(job) -> str:
    """The pool a job ran on, from its log ("started on pool <id>")."""
    return next(line.split()[-1] for line in job.logs().splitlines() if " started on pool " in line)


class Leaky(TinyNet):
    """Changes process-wide state after it trained; with ``probe`` it checks that none of it is there."""

    touched = False

    def setup(self, config):
        if config.get("probe"):
            found = {
                "default dtype": torch.get_default_dtype() != torch.float32,
                "grad mode": not torch.is_grad_enabled(),
                "anomaly detection": torch.is_anomaly_enabled(),
                "a module global": LEAKED is not None,
                "a class attribute": type(self).touched,
            }
            leaked = [name for name, bad in found.items() if bad]
            if leaked:
                raise RuntimeError(f"leaked from an earlier job: {', '.join(leaked)}")
        super().setup(config)

    def after_fit(self, result):
        if not self.config.get("probe"):
            global LEAKED
            LEAKED = "set by a job"
            type(self).touched = True
            torch.set_default_dtype(torch.float64)
            torch.autograd.set_detect_anomaly(True)
            torch.set_grad_enabled(False)


def _same_name(hidden: int) -> type:
    class Net(TinyNet):  # the same module and name for every `hidden`: only the class tells them apart
        def setup(self, config):
            super().setup({**config, "hidden": hidden})

    return Net


@pytest.mark.integration
def test_a_used_pool_trains_exactly_as_a_fresh_one_and_no_job_leaks_into_the_next(ray_session, tiny_data):
    from ray.util.state import list_actors

    def hubs() -> int:
        return len(list_actors(filters=[("class_name", "=", "RunHub"), ("state", "=", "ALIVE")]))

    rm.jobs.release_pools()
    before = hubs()
    earlier = {actor for kind in KINDS for actor in _maps_torch(kind)}  # not this test's pool's
    # A warm pool (`rm.init(warm="torch:2")`): started before any job asks; the first job takes it while
    # its workers still start, and starts no pool of its own.
    (warm,) = ray_session.get(rm.jobs.server().warm.remote([("torch", 2)]))
    (starting,) = rm.jobs.pools()
    assert (starting.id, starting.state, starting.warm, starting.job) == (warm, "starting", True, None)
    fresh_model = TinyNet()
    fresh = fresh_model.train(TWO, data=tiny_data)
    (pool,) = rm.jobs.pools()
    assert (pool.id, pool.state, pool.jobs_run, pool.num_workers, pool.resources) == (warm, "idle", 1, 2, {"CPU": 2.0})
    log = rm.jobs.get(rm.jobs.records()[-1]["id"]).logs()  # what a blocking call says while it waits
    assert f"taking warm pool {warm} of 2 torch worker(s)" in log and " starting pool " not in log
    ray_session.get(rm.jobs.server().warm.remote([]))  # kept, as a plain pool: it ends when idle
    assert not rm.jobs.pools()[0].warm

    Leaky().train({**TWO, "seed": 1}, data=tiny_data)  # sets a global, a class attribute, torch's globals
    Leaky(config={"probe": True}).train(TWO, data=tiny_data)  # raises on the worker if it sees any of it
    small, large = _same_name(3)(), _same_name(16)()
    small.train(TWO, data=tiny_data)
    large.train(TWO, data=tiny_data)  # its own class, not the first `Net`'s
    assert small.net[0].out_features == 3 and large.net[0].out_features == 16

    used_model = TinyNet()
    used = used_model.train(TWO, data=tiny_data)
    (same,) = rm.jobs.pools()
    assert same.id == pool.id and same.jobs_run == 6  # every job ran on the one pool
    assert hubs() == before  # torch gathers through torch.distributed: the pool started no gather hub
    # Its actor built the run's trainer (a DataParallelTrainer), and its Train controller set up the workers'
    # process group (ProcessGroup), without importing torch: torch's library is mapped in this pool's
    # workers' processes, not in its controller's nor in its actor's (the actors not this test's: `earlier`).
    mine = {kind: [v for k, v in _maps_torch(kind).items() if k not in earlier] for kind in KINDS}
    assert mine == {"PoolActor": [False], "TrainController": [False], "RayTrainWorker": [True, True]}, mine
    assert [row["epoch"] for row in used.history] == [1, 2, 3]
    for a, b in zip(fresh.history, used.history, strict=True):
        assert b.keys() == a.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=0), key
    for (name, a), (_, b) in zip(fresh_model.net.state_dict().items(), used_model.net.state_dict().items()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=0, err_msg=name)


KINDS = ("PoolActor", "TrainController", "RayTrainWorker")


def _maps_torch(class_name: str) -> dict[str, bool]:
    """For each live actor of ``class_name`` (this machine's processes; one that just ended is skipped), by
    its id: whether torch's library is loaded in its process."""
    from ray.util.state import list_actors

    alive = list_actors(filters=[("class_name", "=", class_name), ("state", "=", "ALIVE")])
    maps = {a.actor_id: Path(f"/proc/{a.pid}/maps") for a in alive}
    return {actor: "libtorch" in m.read_text() for actor, m in maps.items() if m.exists()}


class Exploding(TinyNet):
    def train_step(self, batch):
        if self.context.epoch == 2:
            raise RuntimeError("the loss exploded")
        return super().train_step(batch)


@pytest.mark.integration
def test_a_killed_worker_resumes_its_job_and_a_failing_job_fails_alone(ray_session, tiny_data, tmp_path):
    marker = tmp_path / "crashed"
    crashing = TinyNet().train(
        {**TWO, "max_failures": 1, "callbacks": [CrashOnce(str(marker), rank=1, epoch=2)]}, data=tiny_data, wait=False
    )
    failing = Exploding().train(TWO, data=tiny_data, wait=False)
    after = TinyNet().train(TWO, data=tiny_data, wait=False)  # queued behind both

    resumed = crashing.wait(timeout=240)
    assert marker.exists(), "the worker never crashed"
    assert [row["epoch"] for row in resumed.history] == [1, 2, 3]  # epoch 1 came back from its checkpoint
    with pytest.raises(TrainingError, match="worker [01]: .*RuntimeError: the loss exploded"):
        failing.wait(timeout=120)
    assert [row["epoch"] for row in failing.history()] == [1]
    result = after.wait(timeout=120)
    assert [row["epoch"] for row in result.history] == [1, 2, 3]
    assert [row["epoch"] for row in after.history()] == [1, 2, 3]  # ran once
    assert _pool_of(crashing) == _pool_of(failing) == _pool_of(after)  # the pool outlived both faults


@pytest.mark.integration
def test_a_class_the_cluster_cannot_load_fails_naming_it(ray_session, tiny_data):
    helpers = types.ModuleType("driver_only_helpers")  # exists in this process only
    exec("class Scale:\n    factor = 2.0\n", helpers.__dict__)
    sys.modules["driver_only_helpers"] = helpers
    try:

        class NeedsHelpers(TinyNet):
            scale = helpers.Scale()

        with pytest.raises(TrainingError) as failed:
            NeedsHelpers().train(TWO, data=tiny_data)
    finally:
        del sys.modules["driver_only_helpers"]
    message = str(failed.value)
    assert "NeedsHelpers" in message and "No module named 'driver_only_helpers'" in message


class RowCounter(rm.Callback):
    """Writes `<rank> <epoch> <rows>` per batch to `<dir>/rows.txt`."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def before_batch(self, batch, batch_idx):
        x = batch["x"] if isinstance(batch, dict) else batch[0]
        with open(Path(self.directory) / "rows.txt", "a") as fh:
            fh.write(f"{self.context.rank} {self.context.epoch} {len(x)}\n")
        return batch


class Splits:
    """A data module: builds its splits on each worker."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def setup(self, config):
        return {"train": PairDataset(self.X[:12], self.y[:12]), "valid": PairDataset(self.X[12:], self.y[12:])}


class DictNet(TinyNet):
    def train_step(self, batch):
        return torch.nn.functional.cross_entropy(self(batch["x"]), batch["y"])

    def validation_step(self, batch):
        return {"val_loss": torch.nn.functional.cross_entropy(self(batch["x"]), batch["y"])}


@pytest.mark.integration
def test_every_kind_of_data_is_sharded_equally_on_a_pool(ray_session, tiny, tmp_path):
    import ray.data

    X, y = tiny
    items = [{"x": X[i], "y": int(y[i])} for i in range(len(X))]
    kinds = {
        "arrays": (TinyNet, rm.data.from_numpy(X, y, valid_fraction=0.25), 12),
        "torch dataset": (TinyNet, PairDataset(X, y), 16),
        "data module": (TinyNet, Splits(X, y), 12),
        "ray dataset": (DictNet, {"train": ray.data.from_items(items), "valid": ray.data.from_items(items[:4])}, 16),
    }
    pools = set()
    for kind, (cls, data, rows) in kinds.items():
        folder = tmp_path / kind.replace(" ", "_")
        folder.mkdir()
        settings = {**TWO, "num_epochs": 2, "callbacks": [RowCounter(str(folder))]}
        job = cls().train(settings, data=data, wait=False)
        result = job.wait(timeout=180)
        pools.add(_pool_of(job))
        assert [row["epoch"] for row in result.history] == [1, 2], kind
        seen: dict[tuple[int, int], int] = {}
        for line in (folder / "rows.txt").read_text().split("\n")[:-1]:
            rank, epoch, n = map(int, line.split())
            seen[rank, epoch] = seen.get((rank, epoch), 0) + n
        assert seen == {(r, e): rows // 2 for r in (0, 1) for e in (1, 2)}, kind  # equal shards, every row once
    assert len(pools) == 1


@pytest.mark.integration
@pytest.mark.beside  # mostly waits: in the second session, while this one computes (tests/beside.py)
def test_an_idle_pool_gives_way_to_other_work_and_ends_after_pool_idle_s(ray_session, tiny_data):
    import ray

    model = TinyNet()
    model.train({**TWO, "num_epochs": 1}, data=tiny_data)  # on the last test's idle pool, or a new one
    assert [p.state for p in rm.jobs.pools()] == ["idle"]  # any other pool gave it room
    assert ray.available_resources().get("CPU", 0.0) == 0.0  # the idle pool holds both CPUs

    @ray.remote(num_cpus=1)
    def user_task():
        return "ran"

    # Ray reported the demand and the pool ended: within 60 s, not after its pool_idle_s of 120
    assert ray.get(user_task.remote(), timeout=60) == "ran"
    until(lambda: rm.jobs.pools() == [], timeout=30)

    model.train({**TWO, "num_epochs": 1}, data=tiny_data)  # a new pool, idle again
    served = model.serve("/pool-gives-way", settings={"ray_actor_options": {"num_cpus": 1}})
    try:
        assert rm.jobs.pools() == []  # deploying ended it, without waiting for pool_idle_s
        answer = requests.post(served.url, json=[[0.0, 0.0, 0.0, 0.0]], timeout=60)
        assert answer.status_code == 200
    finally:
        served.shutdown()

    model.train({**TWO, "num_epochs": 1}, data=tiny_data)
    try:
        rm.init(pool_idle_s=1, warm="torch:2")  # the running server takes both; its idle pool is now warm
        until(lambda: [p.warm for p in rm.jobs.pools()] == [True], timeout=30)
        (kept,) = rm.jobs.pools()
        time.sleep(3)
        assert [(p.id, p.state) for p in rm.jobs.pools()] == [(kept.id, "idle")]  # warm: not ended for idling
        assert rm.jobs.release_pools() == [kept.id]  # given way (as for other work): warmed again when free
        rewarmed = until(lambda: [p for p in rm.jobs.pools() if p.warm and p.state == "starting"], timeout=60)
        assert rewarmed[0].id != kept.id and rewarmed[0].job is None
        rm.init(warm="none")
        seen = set()

        def gone():
            pools = rm.jobs.pools()
            seen.update(p.state for p in pools)
            return not pools

        until(gone, timeout=60)  # no longer warm: idle past pool_idle_s, killed
        assert "idle" not in seen, seen  # while still starting: killed, not waited for (then idle 1 s)
        until(lambda: ray.available_resources().get("CPU", 0.0) == 2.0, timeout=60)
    finally:
        rm.init(pool_idle_s=120, warm="none")


@pytest.mark.integration
def test_tune_trials_with_two_workers_are_jobs_on_one_pool_and_asha_stops_them(ray_session, tiny_data):
    before = {r["id"] for r in rm.jobs.records()}
    result = TinyNet().tune(
        {"lr": rm.tune.grid_search([0.3, 0.1, 0.001, 0.0003])},
        data=tiny_data,
        settings={
            "num_samples": 1,
            "max_epochs": 4,
            "grace_period": 1,
            "reduction_factor": 2,
            "progress": False,
            "train": {"num_workers": 2, "resources_per_worker": {"CPU": 0.95}, "batch_size": 4, "progress": False},
        },
    )
    assert result.num_trials == 4
    jobs = [j for j in rm.jobs.list() if j.id not in before]
    until(lambda: all(j.status in ("SUCCEEDED", "STOPPED", "FAILED") for j in jobs), timeout=60)  # ended with its trial
    assert len(jobs) == 4 and all(j.kind == "train" for j in jobs)  # one job of the server per trial
    assert len({_pool_of(j) for j in jobs}) == 1  # all on one pool
    by_trial = {t["trial_id"]: t for t in result.trials}
    stopped = 0
    for job in jobs:
        (trial_id,) = [t for t in by_trial if t in job.summary["settings"]]  # the trial's storage path
        trial = by_trial[trial_id]
        rows = job.history()
        assert job.status in ("SUCCEEDED", "STOPPED"), job.logs()
        assert [r["epoch"] for r in rows][: trial["epochs"]] == list(range(1, trial["epochs"] + 1))
        if trial["epochs"] < 4:  # ASHA stopped the trial: its job stopped too, within an epoch
            stopped += 1
            assert job.status == "STOPPED" and len(rows) <= trial["epochs"] + 1, job.logs()
    assert stopped >= 1
    assert rm.RayModel.from_checkpoint(result.best_checkpoint).config["lr"] == result.best_config["lr"]


@pytest.mark.integration
def test_a_route_that_fits_beside_an_idle_pool_leaves_it_running(ray_session, tiny, tiny_data):
    """``serve`` ends the idle pools in its replicas' way, not every one: a warm pool of a machine with
    room to spare stays warm."""
    model = TinyNet()
    model.train({**TWO, "num_workers": 1, "num_epochs": 1}, data=tiny_data)  # one CPU of two held
    (pool,) = rm.jobs.pools()
    served = model.serve("/beside-a-pool", settings={"ray_actor_options": {"num_cpus": 0.5}})
    try:
        assert requests.post(served.url, json=tiny[0][:2].tolist(), timeout=60).status_code == 200
        assert [(p.id, p.state) for p in rm.jobs.pools()] == [(pool.id, "idle")]  # room for both: kept
    finally:
        served.shutdown()
