"""Warm pools (``rm.init(warm=...)``, ``raymodel server start --warm``): what they parse to, and that a
job of the same backend and workers asks for exactly the pool warmed. On Ray: tests/test_pools.py. And a
process that ``rm.init`` attached leaves Ray quickly at its exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from models import TinyNet

import raymodel as rm
from raymodel.contract import _table
from raymodel.exceptions import SettingsError
from raymodel.jobs import parse_warm


def test_warm_pools_parse_from_text_a_list_the_environment_and_auto(monkeypatch):
    assert parse_warm("torch:2, lightning:1", cpus=4) == (("torch", 2), ("lightning", 1))
    assert parse_warm("torch:2,rllib", cpus=4) == (("torch", 2), ("rllib", 0))  # no pool: warmed by name
    assert parse_warm([("rllib", 0)], cpus=4) == (("rllib", 0),)
    assert parse_warm([("xgboost", 3)], cpus=4) == (("xgboost", 3),)
    for nothing in ("none", "", "off"):
        assert parse_warm(nothing, cpus=4) == ()
    monkeypatch.setattr(_table, "_DEFINED", {})
    assert parse_warm("auto", cpus=2) == (("torch", 2),)  # no model class defined: torch (installed here)
    assert parse_warm("auto", cpus=8) == (("torch", 2), ("torch", 1))  # room for a 1-worker pool beside it
    assert parse_warm("auto", cpus=3) == (("torch", 2), ("torch", 1))
    assert parse_warm("auto", cpus=1) == (("torch", 1),)
    assert parse_warm("auto", cpus=0) == ()

    class Booster(rm.RayXGBoostModel):
        pass

    class Balancer(rm.RayRLlibModel):
        pass

    class Tagger(rm.RayTransformersModel):
        pass

    class Lit(rm.RayLightningModel):
        pass

    # the backends of the classes defined, in order, as many as the CPUs hold (RLlib's by name: no pool, no
    # CPU); Lightning's jobs take transformers' pool (torch's kind): no second pool for it
    both = (("rllib", 0), ("xgboost", 2), ("transformers", 2))
    assert parse_warm("auto", cpus=8) == (*both, ("xgboost", 1), ("transformers", 1))
    assert parse_warm("auto", cpus=5) == (*both, ("xgboost", 1))
    assert parse_warm("auto", cpus=3) == (("rllib", 0), ("xgboost", 2), ("transformers", 1))
    monkeypatch.setattr(_table, "_DEFINED", {})

    class OnlyRL(rm.RayRLlibModel):
        pass

    assert parse_warm("auto", cpus=8) == (("rllib", 0),)  # no pool: no 1-worker one either
    monkeypatch.setattr(_table, "_DEFINED", {})
    monkeypatch.setenv("RAYMODEL_WARM", "lightgbm:2")
    assert parse_warm(None, cpus=4) == (("lightgbm", 2),)
    monkeypatch.delenv("RAYMODEL_WARM")
    assert parse_warm(None, cpus=2) == (("torch", 2),)  # unset: auto


def test_torch_lightning_and_transformers_jobs_share_pools_of_torchs_kind_and_no_other_does():
    """A job's pool key names the kind of worker group it runs on: torch's for torch, Lightning and
    transformers (the same trainer, process group and collective), so a warm `torch:2` pool takes a
    Lightning job; `torch:2,lightning:2` is one pool whose workers import what each one's first job would."""
    from ray.train import ScalingConfig

    from raymodel.contract import RayTrain, backends
    from raymodel.jobs._request import pool_kind
    from raymodel.jobs._warm import cpus_needed, warm_pool, warm_pools

    kinds: dict[str, list] = {}
    for backend in backends():
        if isinstance(backend.training, RayTrain):
            kinds.setdefault(pool_kind(backend), []).append(backend)
    assert sorted(b.name for b in kinds["torch"]) == ["lightning", "torch", "transformers"]
    assert all([b.name for b in members] == [kind] for kind, members in kinds.items() if kind != "torch")
    for members in kinds.values():  # what a pool's run is made of is the same for each backend of its kind
        made = set()
        for b in members:
            training = b.training
            trainer, options = training.own(ScalingConfig(num_workers=2)) or (training.trainer, training.options())
            made.add((trainer, tuple(sorted((k, type(v).__name__) for k, v in options.items())), training.collective))
        assert len(made) == 1, (members, made)

    keys = {name: warm_pool(name, 2)[0]["key"] for name in ("torch", "lightning", "transformers", "xgboost")}
    assert keys == {
        **dict.fromkeys(("torch", "lightning", "transformers"), "torch/2x[CPU=1]"),
        "xgboost": "xgboost/2x[CPU=1]",
    }
    ((spec, needs),) = warm_pools([("torch", 2), ("lightning", 2)]).values()
    assert spec["names"] == ("torch", "lightning") and needs == {"CPU": 2.0}
    assert "raymodel.backends.torch.loop" in spec["imports"] and "raymodel.backends.lightning._loop" in spec["imports"]
    assert cpus_needed([("torch", 2), ("lightning", 2), ("transformers", 2)]) == 2.0
    assert cpus_needed([("torch", 1), ("lightning", 2)]) == 3.0


def test_rllib_is_warmed_by_name_its_runner_starting_the_algorithms_actor_ahead():
    """RLlib has no pool: `--warm rllib` has the server's next job runner start an Algorithm actor (its
    ``WarmUp.runner_call``), which holds no CPU; it adds no pool and no CPU to wait for."""
    import importlib

    from raymodel.backends.rllib import _run
    from raymodel.jobs._warm import cpus_needed, runner_warms, shown, warm_pools

    specs = [("torch", 2), ("rllib", 0)]
    assert list(warm_pools(specs)) == ["torch/2x[CPU=1]"] and cpus_needed([("rllib", 0)]) == 0
    (call,) = runner_warms(specs)
    assert runner_warms([("torch", 2)]) == ()
    module, _, function = call.partition(":")
    assert callable(getattr(importlib.import_module(module), function))
    assert shown(specs) == "torch:2,rllib"
    for name in _run.ALGORITHM_IMPORTS:  # a name that does not resolve would be skipped in silence
        assert importlib.util.find_spec(name) is not None, name


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("torch", "needs a number of workers: BACKEND:WORKERS"),
        ("torch:0", "whole number >= 1"),
        ("torch:1.5", "whole number >= 1"),
        ("torch:two", "whole number >= 1"),
        ("pytorch:2", "No backend `pytorch` runs on pools: warm one of "),
        ("rllib:1", "Warm `rllib:1`: rllib has no pool of workers to size; write `rllib` alone"),
    ],
)
def test_a_bad_warm_value_says_what_is_wrong(value, says):
    with pytest.raises(SettingsError, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse_warm(value, cpus=2)
    with pytest.raises(SettingsError, match="runs on pools|BACKEND:WORKERS|whole number|alone"):
        rm.init(warm=value)  # before Ray starts


def test_server_start_wait_returns_once_each_warm_pool_is_ready_or_taken_and_names_those_that_are_not(monkeypatch):
    """``raymodel server start --wait`` (``rm.jobs.wait_warm``): a pool still starting, of another size or
    not warm does not count; one a job took does. On a server: tests/test_jobs.py (the server_start job)."""
    from raymodel.jobs import _listing

    def pool(backend: str, workers: int, state: str, warm: bool = True) -> _listing.Pool:
        return _listing.Pool(f"p-{backend}-{workers}", "", backend, workers, {}, state, 0, None, None, 0.0, warm)

    looks = iter(
        [
            [pool("torch", 2, "starting"), pool("xgboost", 1, "idle", warm=False)],
            [pool("torch", 2, "idle"), pool("xgboost", 2, "idle")],  # torch ready; xgboost of another size
            [pool("torch", 2, "busy"), pool("xgboost", 1, "starting"), pool("xgboost", 2, "idle")],
            [pool("torch", 2, "busy"), pool("xgboost", 1, "idle")],  # both: torch's taken by a job
        ]
    )
    seen: list[int] = []
    monkeypatch.setattr(_listing, "pools", lambda: (seen.append(1), next(looks))[1])
    monkeypatch.setattr(_listing.time, "sleep", lambda s: None)
    assert rm.jobs.wait_warm([("torch", 2), ("xgboost", 1)], timeout_s=60) >= 0
    assert len(seen) == 4  # returned at the first look where both were there
    monkeypatch.setattr(_listing, "pools", lambda: [pool("torch", 2, "idle"), pool("lightgbm", 1, "starting")])
    with pytest.raises(rm.RayModelError, match=r"Warm pools not ready after 0 s: lightgbm:1\. .*server status"):
        rm.jobs.wait_warm([("torch", 2), ("lightgbm", 1)], timeout_s=0)


def test_server_start_wait_refuses_warm_pools_that_cannot_all_be_ready_before_starting_anything(
    no_ray, tmp_path, monkeypatch, capsys
):
    """torch:1 and torch:2 hold 3 CPUs together: on a 2-CPU head ``--wait`` would wait for ever."""
    import subprocess as sp

    from raymodel.cli import main

    def forbidden(*args, **kwargs):
        raise AssertionError(f"started something: {args}")

    monkeypatch.setenv("RAYMODEL_SERVER_FILE", str(tmp_path / "server.json"))
    monkeypatch.setattr(sp, "run", forbidden)  # `ray start`
    assert main(["server", "start", "--num-cpus", "2", "--warm", "torch:1,torch:2", "--wait"]) == 1
    said = capsys.readouterr().err
    assert "torch:1,torch:2 hold 3 CPUs together and this head offers 2" in said and "leave out `--wait`" in said
    assert not (tmp_path / "server.json").exists()


def test_a_pool_is_ready_once_every_rank_has_asked_for_a_job_and_settled():
    """``wait_ready`` (a warm pool's readiness: what ``--wait`` waits for) needs each rank in ``take`` and
    settled (``_settle``: its first job's imports in, what it holds frozen). Ready at the first ``take``,
    the first job on a warm torch pool waited for the rest: 1.0-1.5 s to its first row, the second 0.5 s."""
    import threading

    from raymodel._internal import serialization
    from raymodel.jobs._pools.pool import PoolActor
    from raymodel.jobs._warm import pool_backends

    backend = pool_backends()["torch"]
    pool = PoolActor("pool-test", serialization.dumps(backend, type(backend)), 2, {"CPU": 1.0}, False)
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(pool.wait_ready()), daemon=True)
    takers = [threading.Thread(target=pool.take, args=(rank, 0, 0), daemon=True) for rank in (0, 1)]
    for thread in (waiter, *takers):
        thread.start()
    with pool.cond:
        assert pool.cond.wait_for(lambda: pool.joined == {0, 1}, timeout=10)
    waiter.join(0.5)
    assert waiter.is_alive()  # both ranks asked for a job; neither settled
    pool.settle(0)
    waiter.join(0.5)
    assert waiter.is_alive()
    pool.settle(1)
    waiter.join(10)
    assert answers == [True]
    pool.end()  # the ranks' `take` returns None: the pool ends
    for thread in takers:
        thread.join(10)
        assert not thread.is_alive()


def test_the_next_jobs_runner_imports_the_warm_pools_frameworks_while_it_waits(monkeypatch):
    """The payload of a job on a warm torch pool imports torch as its runner unpickles it (about 1 s of
    the first job, before any epoch): the server's spare runner imports it once the pools are warmed."""
    import sys

    from raymodel.jobs import _address
    from raymodel.jobs._server.runner import JobRunner, Runners
    from raymodel.jobs._warm import runner_imports

    assert runner_imports(["torch", "torch", "rllib"]) == ("torch", "raymodel.backends.torch.backend")  # no pool
    monkeypatch.setattr(_address, "running_handle", lambda: None)
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    JobRunner().warm(("colorsys", "no_such_framework"))  # one that is not installed: the job says so
    assert "colorsys" in sys.modules

    told: list[tuple[tuple[str, ...], ...]] = []

    class Spare:  # the handle of the server's spare runner
        class warm:
            remote = staticmethod(lambda *args: told.append(args))

    runners = object.__new__(Runners)  # the server's part, without the spare runner it starts
    runners.spare = Spare()
    runners.warm([("torch", 2)])
    assert told == [(("torch", "raymodel.backends.torch.backend"), ())]
    runners.warm([("rllib", 0)])  # no pool: the runner's call starts RLlib's Algorithm actor
    assert told[-1] == ((), ("raymodel.backends.rllib:warm_algorithm_actor",))

    _MADE.clear()
    runner = JobRunner()
    runner.job_id = "a job ran here: its imports are in"  # a used runner, the spare again
    runner.warm((), (f"{__name__}:_call_me", f"{__name__}:_fails", "no_such_module:call"))
    assert _MADE == ["called"]  # each call made (one that fails: the job starts what it needs itself)


_MADE: list[str] = []


def _call_me() -> None:
    _MADE.append("called")


def _fails() -> None:
    raise RuntimeError("cannot start it here")


def test_a_job_that_arrives_while_its_runner_imports_ahead_waits_for_those_imports(monkeypatch):
    """The runner's imports ahead and a job run on two threads of its actor: a job that arrives meanwhile
    waits for them (a framework imported by two threads at once failed: transformers' lazy module said
    "cannot import name 'PreTrainedTokenizerFast'"); a second, late call to ``warm`` imports nothing."""
    import importlib
    import threading

    from raymodel.jobs import _address
    from raymodel.jobs._server import execute
    from raymodel.jobs._server.runner import JobRunner

    monkeypatch.setattr(_address, "running_handle", lambda: None)
    entered, release, late = threading.Event(), threading.Event(), []
    real = importlib.import_module

    def import_module(name, *args):
        if name == "slow_framework":
            entered.set()
            assert release.wait(60)
        elif name == "late_framework":
            late.append(name)
        else:
            return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    ran: list[bool] = []
    monkeypatch.setattr(execute, "run_job", lambda runner, *args: ran.append(release.is_set()) or {})
    runner = JobRunner()
    warming = threading.Thread(target=runner.warm, args=(("slow_framework",),))
    warming.start()
    assert entered.wait(60)
    job = threading.Thread(target=runner.run, args=("job-1", "train", b""))
    job.start()
    job.join(0.5)
    assert job.is_alive() and ran == []  # still waiting for the imports ahead
    release.set()
    job.join(60)
    warming.join(60)
    assert ran == [True] and runner.job_id == "job-1"
    runner.warm(("late_framework",))
    assert late == []


#: In a fresh process: a transformers job's runner after its imports ahead, then the set-up that takes the
#: submitted weights (``execute._restore_state``): the modules that set-up still imports.
_RUNNER_SETUP = """
import importlib, json, sys
from raymodel.jobs._warm import runner_imports
for name in runner_imports(["transformers"]):
    importlib.import_module(name)
import hf_models
before = set(sys.modules)
hf_models.Poet().ensure_setup()
print("NEW " + json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_transformers_jobs_runner_imports_ahead_what_setting_its_model_up_imports():
    """Setting a transformers model up imports ``transformers.modeling_utils`` (``PreTrainedModel``), 1-2 s
    and over a thousand modules: the runner imports it ahead (``WarmUp.runner_imports``), so a job's set-up imports
    only its model family's modules and the tokenizer's."""
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER_SETUP], cwd=os.path.dirname(__file__), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    new = json.loads(done.stdout.split("NEW ", 1)[1])
    assert "transformers.models.gpt2.modeling_gpt2" in new  # the set-up ran, and imported its family
    assert [m for m in new if m.split(".")[0] not in ("transformers", "tokenizers")] == []


def test_a_job_with_default_placement_asks_for_the_warm_pool(tiny_data):
    """The warm pool's key and resources are those of a job of that backend and worker count: a job with
    default placement takes it; one with other resources does not."""
    from raymodel.jobs._request import train_request
    from raymodel.jobs._warm import warm_pool
    from raymodel.train import prepare

    spec, needs = warm_pool("torch", 2)
    for settings, same in (
        ({"num_workers": 2, "num_epochs": 1, "progress": False}, True),
        ({"num_workers": 2, "num_epochs": 4, "batch_size": 3, "priority": 5, "progress": False}, True),
        ({"num_workers": 1, "num_epochs": 1, "progress": False}, False),
        ({"num_workers": 2, "resources_per_worker": {"CPU": 0.5}, "progress": False}, False),
    ):
        model = TinyNet()
        checked, data = prepare(model, rm.TrainSettings(**settings), tiny_data)
        _, request = train_request(model, checked, data)
        assert (request["pool"]["key"] == spec["key"]) is same, settings
        if same:
            assert request["needs"] == needs and request["pool"]["num_workers"] == spec["num_workers"]


def test_two_sizes_of_one_backend_are_two_warm_pools_each_taken_by_its_own_size(tiny_data):
    """``torch:1,torch:2``: a pool of each size, so a 1-worker job after a 2-worker one finds its own."""
    from raymodel.jobs._request import train_request
    from raymodel.jobs._warm import warm_pool
    from raymodel.train import prepare

    specs = parse_warm("torch:1,torch:2", cpus=4)
    keys = {n: warm_pool(name, n)[0]["key"] for name, n in specs}
    assert specs == (("torch", 1), ("torch", 2)) and keys[1] != keys[2]
    for workers in (1, 2):
        model = TinyNet()
        checked, data = prepare(model, rm.TrainSettings(num_workers=workers, progress=False), tiny_data)
        assert train_request(model, checked, data)[1]["pool"]["key"] == keys[workers]


def test_warm_pools_of_one_kind_start_one_after_another_each_once_the_one_before_is_ready(monkeypatch, capsys):
    """``torch:2,xgboost:1,torch:1`` (``auto`` where the CPUs hold both sizes): torch's and xgboost's first
    pools start at once, torch's 1-worker pool once its 2-worker pool is ready, where the cluster has room
    for it then. The server's logic in-process; on Ray: tests/multinode.py."""
    from types import SimpleNamespace

    from raymodel.jobs._pools import keeper
    from raymodel.jobs._server.book import JobBook
    from raymodel.jobs._server.records import PoolRecord
    from raymodel.jobs._server.watched import Watched
    from raymodel.jobs._warm import warm_pools

    free = {"CPU": 1.0}
    monkeypatch.setattr(keeper, "ray", SimpleNamespace(available_resources=lambda: dict(free), get=lambda ref: ref))

    class Keeper(keeper.PoolKeeper):
        def __init__(self, specs):
            super().__init__(JobBook(), Watched(), idle_s=120)
            self.warm_pools = warm_pools(specs)

        def _new_pool(self, spec, needs, job_id):  # no actor: its record only
            pool_id = f"{spec['kind']}:{spec['num_workers']}"
            self.pools[pool_id] = PoolRecord(pool_id, spec["key"], spec["kind"], spec["num_workers"], needs, "idle", 0)
            return pool_id

    server = Keeper([("torch", 2), ("xgboost", 1), ("torch", 1)])
    assert server._start_warm(check_room=False) == ["torch:2", "xgboost:1"]  # not torch:1: behind torch:2
    server._ready("xgboost:1", True)
    assert list(server.pools) == ["torch:2", "xgboost:1"]  # another kind's readiness does not start it
    server._ready("torch:2", True)
    assert list(server.pools) == ["torch:2", "xgboost:1", "torch:1"]
    assert "warming pool torch:1 of 1 torch worker(s)" in capsys.readouterr().out

    free["CPU"] = 0.0  # no room when the first is ready: not started (the server's re-warming looks later)
    server = Keeper([("torch", 2), ("torch", 1)])
    assert server._start_warm(check_room=False) == ["torch:2"]
    server._ready("torch:2", True)
    assert list(server.pools) == ["torch:2"]
    free["CPU"] = 1.0
    assert server._start_warm(check_room=False) == ["torch:1"]  # the 2-worker one ready: not behind now
    server.pools["torch:2"].state = "ending"
    assert server._behind(next(reversed(server.warm_pools)))  # behind again while the first is not running


def test_what_a_pools_workers_import_ahead_exists():
    """``PoolKind.worker_imports``: what a pool's worker imports while it waits for its first job (and
    ``WarmUp.runner_imports``, a runner's); a name that does not resolve would be skipped in silence (the job
    imports it anyway), so it is checked here."""
    import importlib.util

    from raymodel.contract import backends

    for backend in backends():
        worker_imports = backend.pool.worker_imports if backend.pool is not None else ()
        for module in (*worker_imports, *backend.warm_up.runner_imports):
            assert importlib.util.find_spec(module) is not None, (backend.name, module)
        if backend.name in ("torch", "lightning", "transformers"):
            assert "torch._dynamo" in worker_imports  # the first optimizer's import (~2 s)


#: A hook registered before ``rm.init`` runs after raymodel's exit hook (``atexit`` runs the last registered
#: first) and before Ray's own (registered when ``ray`` was imported, earlier still): it sees what
#: raymodel's hook left, and the order in which Ray's node (of an instance started here) ended its processes.
_AT_EXIT = """
import atexit, gc, json, sys
import ray
from ray._private.node import Node
import raymodel as rm
ended = []
kill = Node._kill_process_type
def record(node, kind, **kw):
    if kind in node.all_processes:
        ended.append(kind)
    kill(node, kind, **kw)
Node._kill_process_type = record
seen = lambda: {"attached": ray.is_initialized(), "frozen": gc.get_freeze_count(), "ended": ended}
atexit.register(lambda: print("AT EXIT " + json.dumps(seen())))
rm.init(verbose=sys.argv[1] == "verbose")
assert ray.is_initialized() and gc.get_freeze_count() == 0
"""


@pytest.mark.integration
def test_a_process_that_rm_init_attached_leaves_ray_at_once_and_skips_the_final_collections(ray_session):
    """Ray's exit hook waits 0.5 s for workers' log lines that a quiet process did not ask for, and the
    interpreter's last garbage collections walk torch's objects (2.1 s from a joined process's last line
    to its exit, 0.55 s without both): a quiet process has left Ray before Ray's hook runs, and every
    process ``rm.init`` attached has frozen what was left. A process that started its own instance ends
    its autoscaler monitor first: Ray ends it after the GCS, and its SIGTERM handler, which reports to the
    GCS, waited out Ray's second before it was killed (Ray's shutdown 1.72 s, 0.46 s with it ended first)."""
    joined = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}  # this session's
    own = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAYMODEL_WARM": "none"}
    seen = {}
    for mode, env in (("quiet", joined), ("verbose", joined), ("own", own)):
        args = [sys.executable, "-c", _AT_EXIT, mode]
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("AT EXIT ")]
        seen[mode] = json.loads(line[len("AT EXIT ") :])
    assert seen["quiet"]["attached"] is False  # left without Ray's wait
    assert seen["verbose"]["attached"] is True  # asked for the workers' lines: Ray's hook waits for them
    assert seen["quiet"]["frozen"] > 10_000 and seen["verbose"]["frozen"] > 10_000
    assert seen["quiet"]["ended"] == []  # a joined process ends none of the cluster's processes
    assert seen["own"]["attached"] is False and seen["own"]["frozen"] > 10_000
    ended = seen["own"]["ended"]
    assert ended[0] == "monitor" and {"raylet", "gcs_server"} <= set(ended[1:]), ended
