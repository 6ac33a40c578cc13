"""Releases (issue 59): what a release is given, checked before anything runs, and the gate's decision."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lane
import pytest
import ray
import requests
from in_process import StoringSession, run_in_process
from models import TinyNet
from traffic import Clients
from waiting import until

import raymodel as rm
from raymodel.exceptions import DataError, ModelDefinitionError, SettingsError, TrainingError
from raymodel.jobs._release_plan import STAGES, Gate, RolloutPlan, decide

TESTS = str(Path(__file__).resolve().parent)


def test_a_gate_passes_a_candidate_that_beats_against_by_min_delta_and_names_both_figures():
    gate = Gate(metric="val_acc", mode="max", min_delta=0.01, against="digits@production")
    assert decide(gate, 0.93, 0.91) == (True, "val_acc 0.93 against 0.91 of digits@production (min_delta 0.01)")
    passed, why = decide(gate, 0.915, 0.91)
    assert not passed and "val_acc 0.915 against 0.91 of digits@production" in why and "needs 0.92" in why
    lenient = Gate(metric="val_acc", min_delta=-0.02, against="digits@production")  # up to 0.02 worse
    assert decide(lenient, 0.90, 0.91)[0] and not decide(lenient, 0.88, 0.91)[0]
    loss = Gate(metric="val_loss", mode="min", against="digits@production")
    assert decide(loss, 0.2, 0.3)[0] and not decide(loss, 0.31, 0.3)[0] and decide(loss, 0.3, 0.3)[0]
    assert not decide(loss, float("nan"), 0.3)[0]


def test_a_first_release_passes_on_its_threshold_alone_or_passes():
    assert decide(Gate(metric="val_acc"), 0.1, None) == (True, "val_acc 0.1; no version to beat")
    gate = Gate(metric="val_acc", threshold=0.9, against="digits@production")
    assert decide(gate, 0.95, None)[0] and not decide(gate, 0.85, None)[0]
    assert not decide(gate, 0.85, 0.5)[0]  # beating `against` does not excuse missing the threshold
    for diverged in (float("nan"), float("inf")):  # nothing to beat, no threshold: still not a score
        assert decide(Gate(metric="val_loss", mode="min"), diverged, None) == (
            False,
            f"val_loss {diverged} is not a finite number",
        )


def test_bad_gates_and_plans_are_refused_naming_each_problem():
    with pytest.raises(SettingsError, match=r"`metric` names a figure.*`mode` is 'max' or 'min'.*`min_delta`"):
        Gate(metric="", mode="up", min_delta="x")
    with pytest.raises(SettingsError, match="`against` must be a registry reference"):
        Gate(metric="val_acc", against="digits@")
    with pytest.raises(SettingsError, match=r"must end at 1\.0"):
        RolloutPlan(steps=(0.1, 0.5))
    with pytest.raises(SettingsError, match="must increase"):
        RolloutPlan(steps=(0.5, 0.1, 1.0))
    with pytest.raises(SettingsError, match="Gate has no field"):
        Gate.coerce({"metric": "val_acc", "agianst": "digits@production"})
    plan = RolloutPlan.coerce({"steps": [0.2, 1], "guard": {"max_error_rate": 0.0}})
    assert plan.steps == (0.2, 1.0) and plan.guard.max_error_rate == 0.0


def test_a_model_that_cannot_be_served_on_the_route_is_refused_before_ray_is_asked_for(tiny, monkeypatch):
    from raymodel._ray import cluster

    class Unservable(TinyNet):
        input_schema = {"type": "tensor"}  # no JSON Schema type: no route can validate its requests

    def asked(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the release asked for Ray before it refused the model")

    monkeypatch.setattr(cluster, "ensure_ray", asked)
    X, y = tiny
    with pytest.raises(ModelDefinitionError, match=r"Unservable\.input_schema"):
        Unservable().release(
            data=rm.data.from_numpy(X, y, valid_fraction=0.25),
            settings={"num_epochs": 1, "batch_size": 4},
            register="tiny",
            gate={"metric": "val_loss", "mode": "min"},
            route="/tiny",
        )


def test_an_evaluation_run_scores_a_checkpoint_as_training_validated_it_and_trains_nothing(tmp_path, tiny):
    """``WorkerRun``'s evaluate mode, in-process (the real torch loop): the last checkpoint's figures
    are the last epoch's validation, the validation hooks run, no epoch, no report, no checkpoint."""
    from raymodel.train import TrainSettings, WorkerRun
    from raymodel.train._driver import worker_payload

    X, y = tiny
    data = rm.data.from_numpy(X, y, valid_fraction=0.25)
    trained = run_in_process(
        TinyNet(), {"num_epochs": 3, "batch_size": 4}, data, StoringSession(tmp_path / "run"), tmp_path / "run"
    )
    last = tmp_path / "run" / "checkpoint_epoch_000003"
    seen = Seen(tmp_path / "seen.txt")
    settings = TrainSettings.coerce({"batch_size": 4, "callbacks": [seen]})
    session = StoringSession(tmp_path / "evaluation")
    blob = worker_payload(
        TinyNet(), settings, {"name": "e", "path": str(tmp_path / "evaluation"), "evaluate": str(last)}
    )
    scored = WorkerRun({"payload": blob, "data": data, "hub": None}, session=session).run()
    final = trained["history"][-1]
    assert scored["history"] == [] and scored["evaluated"] == str(last)
    assert scored["metrics"] == pytest.approx({"val_loss": final["val_loss"], "val_acc": final["val_acc"]}, rel=1e-6)
    assert seen.path.read_text().split() == ["before_validation", "after_validation"] and session.reports == []
    assert not (tmp_path / "evaluation").exists()  # nothing written

    untrained = WorkerRun(
        {
            "payload": worker_payload(
                TinyNet(), settings, {"evaluate": str(tmp_path / "run" / "checkpoint_epoch_000001")}
            ),
            "data": data,
            "hub": None,
        },
        session=session,
    ).run()
    assert untrained["metrics"]["val_loss"] != pytest.approx(final["val_loss"])  # the checkpoint named is scored


def test_scoring_without_held_out_data_says_how_to_give_it(tmp_path, tiny):
    from raymodel.train import TrainSettings, WorkerRun
    from raymodel.train._driver import worker_payload

    X, y = tiny
    run_in_process(
        TinyNet(),
        {"num_epochs": 1, "batch_size": 4},
        rm.data.from_numpy(X, y, valid_fraction=0),
        StoringSession(tmp_path),
        tmp_path,
    )
    blob = worker_payload(TinyNet(), TrainSettings(), {"evaluate": str(tmp_path / "checkpoint_epoch_000001")})
    with pytest.raises(DataError, match="valid_fraction"):
        WorkerRun(
            {"payload": blob, "data": rm.data.from_numpy(X, y, valid_fraction=0), "hub": None},
            session=StoringSession(tmp_path),
        ).run()


class Seen(rm.Callback):
    """Writes the hooks it sees to a file (the run's copy of it is unpickled from the payload)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _saw(self, name: str) -> None:
        with open(self.path, "a") as file:
            file.write(name + "\n")

    def before_validation(self):
        self._saw("before_validation")

    def after_validation(self, metrics):
        self._saw("after_validation")

    def before_epoch(self, epoch):
        self._saw("before_epoch")


# ---------------------------------------------------------------------------- on real Ray
SMALL = {"ray_actor_options": {"num_cpus": 0.25}}
TRAIN = {"num_workers": 1, "num_epochs": 3, "batch_size": 64, "progress": False, "pool": False}


@pytest.fixture(scope="module")
def released(ray_session, tmp_path_factory):
    """A registry of the module's own with `digits:1` as `digits@production` (barely trained), served at
    `/release`; the data (scikit-learn's digits, a fifth held out) and a request's body."""
    from models import DigitsNet, digits_data

    before = os.environ.get("RAYMODEL_REGISTRY")
    os.environ["RAYMODEL_REGISTRY"] = str(tmp_path_factory.mktemp("release") / "registry")
    data = digits_data()
    first = DigitsNet(config={"lr": 1e-4})
    first.train({**TRAIN, "num_epochs": 1}, data=data)
    rm.registry.put(first, "digits", "production")
    served = rm.Servable("digits@production", "/release", settings=SMALL).deploy()
    body = {"pixels": data.splits["valid"].x[:1].tolist()}
    yield {"data": data, "served": served, "body": body}
    served.shutdown()
    if before is None:
        os.environ.pop("RAYMODEL_REGISTRY", None)
    else:
        os.environ["RAYMODEL_REGISTRY"] = before


def any_score_release(released: dict[str, Any], rollout: Any) -> Any:
    """A one-epoch release of a DigitsNet onto `/release` whose gate passes any score, rolled out by ``rollout``."""
    from models import DigitsNet

    return DigitsNet().release(
        data=released["data"],
        settings={**TRAIN, "num_epochs": 1},
        register="digits",
        gate=rm.Gate(metric="val_acc", against="digits@production", min_delta=-1.0),
        route="/release",
        rollout=rollout,
        wait=False,
    )


def running_rollouts() -> list[Any]:
    return [r for r in rm.serve.rollouts() if r.state()["status"] == "running"]


@pytest.mark.integration
@pytest.mark.beside  # rollouts' steps and jobs' waits: the second session (tests/beside.py)
def test_a_better_candidate_goes_from_data_to_production_in_one_job_while_every_request_is_answered(released):
    from models import DigitsNet

    clients = Clients(released["served"].url, released["body"], n=2)
    try:
        job = DigitsNet().release(
            data=released["data"],
            settings=TRAIN,
            register="digits",
            gate=rm.Gate(metric="val_acc", against="digits@production"),
            route="/release",
            rollout=rm.RolloutPlan(steps=(0.5, 1.0), step_s=1, guard=rm.Guard(max_error_rate=0.0, min_requests=10)),
            wait=False,
        )
        assert job.kind == "release" and job.stage in STAGES
        result = job.wait(timeout=600)
    finally:
        answers = clients.stop()
    assert result.status == "SUCCEEDED" and job.status == "SUCCEEDED", result
    assert result.version == "digits:2" and "digits@production names it" in result.reason, result.reason
    assert [row["stage"] for row in result.stages] == list(STAGES) and job.stage == "promote"
    epochs = [row for row in job.history() if "epoch" in row]
    assert [(row["epoch"], row["stage"]) for row in epochs] == [(1, "train"), (2, "train"), (3, "train")]
    judged = result.stage("evaluate")
    assert judged["passed"] and judged["against_version"] == "digits:1", judged
    assert judged["candidate"]["val_acc"] > judged["against"]["val_acc"] + 0.3, judged  # scored on the same split
    record = rm.registry.show("digits", "production")
    assert record.version == 2 and record.lineage["job"] == job.id and record.lineage["parent"] == "digits:1"
    assert record.lineage["gate"]["candidate"] == judged["candidate"], record.lineage
    assert len(answers) > 20 and {status for _, status, _ in answers} == {200}, answers[-5:]
    assert {"digits:2"} <= {version for _, _, version in answers}, answers[-5:]  # served during the rollout


@pytest.mark.integration
@pytest.mark.beside  # rollouts' steps and jobs' waits: the second session (tests/beside.py)
def test_a_worse_candidate_is_rejected_at_the_gate_with_both_figures_and_nothing_is_touched(released, capsys):
    """``release`` waits by default, as ``train`` and ``tune`` do: it prints each stage as it ends and
    returns the ``ReleaseResult``."""
    from models import DigitsNet

    versions = [r.version for r in rm.registry.list("digits")]
    production = rm.registry.show("digits", "production").version
    result = DigitsNet(config={"lr": 0.0}).release(
        data=released["data"],
        settings={**TRAIN, "num_epochs": 1},
        register="digits@candidate",
        gate=rm.Gate(metric="val_acc", against="digits@production", min_delta=0.0),
        route="/release",
        rollout={"steps": (1.0,), "step_s": 0},
    )
    assert isinstance(result, rm.ReleaseResult) and result.status == "REJECTED", result
    job = [j for j in rm.jobs.list() if j.kind == "release"][-1]  # the newest: this one
    assert job.status == "REJECTED"
    printed = capsys.readouterr().out
    assert f"{job.id} evaluate" in printed and f"{job.id} REJECTED: {result.reason}" in printed, printed
    judged = result.stage("evaluate")
    mine, theirs = judged["candidate"]["val_acc"], judged["against"]["val_acc"]
    assert mine < theirs and f"val_acc {mine:.6g} against {theirs:.6g} of digits@production" in result.reason
    assert result.version is None and [row["stage"] for row in result.stages] == ["train", "evaluate"]
    assert [r.version for r in rm.registry.list("digits")] == versions  # nothing registered
    assert rm.registry.show("digits", "production").version == production  # no alias moved
    info = requests.get(released["served"].url + "/info", timeout=30).json()
    assert info["split"] == {"digits@production": 1.0} and info["rollout"] is None  # the route as it was


@pytest.mark.integration
@pytest.mark.beside  # rollouts' steps and jobs' waits: the second session (tests/beside.py)
def test_a_release_whose_server_and_rollout_controller_die_in_its_rollout_goes_on_to_promote(released):
    """On the route the releases above promoted and rejected on: the training server's actor and the
    rollout controller's are killed (Ray restarts them) while the release is in its rollout. The job
    goes on: the new controller takes the rollout up from storage, the new runner follows it, and the
    candidate is promoted; it never stays RUNNING with nothing happening."""
    from raymodel.jobs._address import NAME, NAMESPACE
    from raymodel.serve._rollouts.rollout import CONTROLLER, NAMESPACE as ROLLOUTS_NAMESPACE

    versions = len(rm.registry.list("digits"))
    clients = Clients(released["served"].url, released["body"], n=2)
    try:
        job = any_score_release(released, rm.RolloutPlan(steps=(0.5, 1.0), step_s=4, guard=rm.Guard(min_requests=10)))
        until(lambda: job.stage == "rollout" and running_rollouts(), 300)
        ray.kill(ray.get_actor(NAME, namespace=NAMESPACE), no_restart=False)
        ray.kill(ray.get_actor(CONTROLLER, namespace=ROLLOUTS_NAMESPACE), no_restart=False)
        result = job.wait(timeout=300)
    finally:
        answers = clients.stop()
    assert result.status == "SUCCEEDED", (result.status, result.reason, job.logs()[-2000:])
    assert [row["stage"] for row in result.stages] == list(STAGES)
    assert len(rm.registry.list("digits")) == versions + 1  # registered once
    assert rm.registry.show("digits", "production").version == int(result.version.split(":")[1])
    assert {status for _, status, _ in answers} == {200}, answers[-5:]


@pytest.mark.integration
@pytest.mark.beside  # rollouts' steps and jobs' waits: the second session (tests/beside.py)
def test_a_candidate_that_breaks_its_guard_is_rolled_back_and_no_alias_moves(released):
    from models import FlakyDigits

    production = rm.registry.show("digits", "production").version
    clients = Clients(released["served"].url, released["body"], n=2)
    try:
        job = FlakyDigits().release(
            data=released["data"],
            settings=TRAIN,
            register="digits",
            gate=rm.Gate(metric="val_acc", against="digits@production", min_delta=-1.0),  # any score passes
            route="/release",
            rollout=rm.RolloutPlan(steps=(0.5, 1.0), step_s=30, guard=rm.Guard(max_error_rate=0.01, min_requests=10)),
            wait=False,
        )
        result = job.wait(timeout=600)
    finally:
        clients.stop()
    assert result.status == "ROLLED_BACK" and job.status == "ROLLED_BACK", result
    assert "failed" in result.reason and "no alias moved" in result.reason, result.reason
    assert result.version is not None and result.stage("register")["version"] == result.version  # registered
    assert rm.registry.show("digits", "production").version == production
    info = requests.get(released["served"].url + "/info", timeout=30).json()
    assert info["split"] == {"digits@production": 1.0} and info["serving"] == f"digits:{production}"


@pytest.mark.integration
@pytest.mark.beside  # rollouts' steps and jobs' waits: the second session (tests/beside.py)
def test_a_rollout_stopped_by_another_hand_fails_the_release_and_moves_no_alias(released):
    """Not ``job.stop()``: ``rollout.stop()`` (an operator's, or the controller's when the route does not
    come back after a restart) ends the rollout, the route back to what it served; the release did not
    reach production, so it ends FAILED, saying so, not SUCCEEDED without promoting."""
    production = rm.registry.show("digits", "production").version
    job = any_score_release(released, rm.RolloutPlan(steps=(0.5, 1.0), step_s=600, guard=rm.Guard(min_requests=5)))
    until(lambda: job.stage == "rollout" and running_rollouts() and running_rollouts()[0].state()["step"] == 1, 300)
    (rollout,) = running_rollouts()
    rollout.stop()  # by another hand than the job's
    with pytest.raises(TrainingError, match="ended without promoting it: stopped at step 1"):
        job.wait(timeout=120)
    assert job.status == "FAILED" and "ended without promoting" in job.error
    assert [row["stage"] for row in job.history() if "end" in row and row.get("epoch") is None] == [
        "train",
        "evaluate",
        "register",
        "rollout",
    ]
    assert rm.registry.show("digits", "production").version == production  # no alias moved
    info = requests.get(released["served"].url + "/info", timeout=30).json()
    assert info["split"] == {"digits@production": 1.0} and info["serving"] == f"digits:{production}"


@pytest.mark.integration
@pytest.mark.beside  # rollouts' steps and jobs' waits: the second session (tests/beside.py)
def test_what_a_release_cannot_do_is_refused_before_anything_runs(released):
    from models import DigitsNet

    data, jobs_before = released["data"], len(rm.jobs.list())
    base = {"data": data, "settings": TRAIN, "register": "digits"}
    for more, says in (
        (
            {"gate": rm.Gate(metric="val_f1", against="digits@production")},
            r"`gate.metric='val_f1'`.*reports: .*val_acc",
        ),
        ({"gate": rm.Gate(metric="val_acc", against="digits:99")}, r"names no version.*versions: 1"),
        ({"gate": rm.Gate(metric="val_acc", against="other@production")}, "is a version of `other`"),
        ({"gate": {"metric": "val_acc"}, "route": "/nothing-here"}, r"`route='/nothing-here'` is not served"),
        ({"gate": {"metric": "val_acc"}, "rollout": {"steps": (0.5, 0.9)}}, "must end at 1.0"),
        ({"gate": {"metric": "val_acc"}, "rollout": {"steps": (0.5, 0.2, 1.0)}}, "must increase"),
    ):
        with pytest.raises(SettingsError, match=says):
            DigitsNet().release(**base, **more)
    X, y = data.splits["train"].x, data.splits["train"].y
    with pytest.raises(DataError, match="held-out data"):
        DigitsNet().release(
            data=rm.data.from_numpy(X, y, valid_fraction=0), register="digits", gate={"metric": "val_acc"}
        )
    assert len(rm.jobs.list()) == jobs_before  # nothing was queued


@pytest.mark.integration
@pytest.mark.beside  # rollouts' steps and jobs' waits: the second session (tests/beside.py)
def test_a_release_whose_server_is_killed_while_it_trains_ends_with_each_epoch_once_and_one_version(
    released, tiny_data
):
    """The server's actor killed mid-training: the release's runner dies with it; the restarted server
    runs the job again, which resumes from its newest checkpoint and goes on through every stage."""
    from models import SlowNet

    from raymodel.jobs._address import NAME, NAMESPACE

    job = SlowNet(config={"step_s": 0.1}).release(
        data=tiny_data,
        settings={"num_workers": 1, "num_epochs": 6, "batch_size": 8, "progress": False},
        register="slow@production",
        gate=rm.Gate(metric="val_loss", mode="min", against="slow@production"),  # the first: nothing to beat
        wait=False,
    )
    until(lambda: len(job.history()) >= 2, 180)
    ray.kill(ray.get_actor(NAME, namespace=NAMESPACE), no_restart=False)  # Ray restarts it
    result = job.wait(timeout=300)
    assert result.status == "SUCCEEDED", result
    epochs = [row["epoch"] for row in job.history() if "epoch" in row]
    assert epochs == [1, 2, 3, 4, 5, 6], epochs
    assert job.logs().count("epoch 1:") == 1, job.logs()  # resumed from its checkpoint, not from scratch
    assert "the job server restarted while it ran" in job.logs()
    assert [row["stage"] for row in result.stages] == ["train", "evaluate", "register", "promote"]
    assert result.stage("evaluate")["against"] is None and "no version to beat" in result.stage("evaluate")["reason"]
    (record,) = rm.registry.list("slow")
    assert record.lineage["job"] == job.id and record.aliases == ["production"]


def test_a_candidate_is_registered_once_whatever_runner_registers_it(tmp_path, tiny):
    """A runner started again after it registered (its row not written yet) finds the version whose
    lineage names the job: no second version."""

    from raymodel.jobs._server.release import _register

    X, y = tiny
    run_in_process(
        TinyNet(), {"num_epochs": 1, "batch_size": 4}, rm.data.from_numpy(X, y), StoringSession(tmp_path), tmp_path
    )
    plan = {"registry": str(tmp_path / "registry"), "key": "tiny", "alias": "candidate", "parent": None}
    judged = {"candidate": {"val_loss": 0.5}, "against": None, "reason": "no version to beat", "against_version": None}
    checkpoint = str(tmp_path / "checkpoint_epoch_000001")
    assert _register(plan, "release-1", checkpoint, judged) == "tiny:1"
    assert _register(plan, "release-1", checkpoint, judged) == "tiny:1"  # again: the same version
    assert _register(plan, "release-2", checkpoint, judged) == "tiny:2"  # another job: its own
    lineage = rm.registry.open(plan["registry"]).show("tiny", 1).lineage
    assert lineage["job"] == "release-1" and lineage["gate"]["candidate"] == {"val_loss": 0.5}


# ------------------------------------------- a head restarted in the rollout stage (on the lane)
SETUP = """
import sys
sys.path.insert(0, {tests!r})
import raymodel as rm
from models import DigitsNet, digits_data
rm.init()  # attaches to `raymodel server start`
first = DigitsNet(config={{"lr": 1e-4}})
first.train({{"num_workers": 1, "num_epochs": 1, "batch_size": 64, "progress": False}}, data=digits_data())
print(rm.registry.put(first, "digits", "production"))
rm.Servable("digits@production", "/rel", settings={{"ray_actor_options": {{"num_cpus": 0.25}}}}).deploy()
"""

#: Waits until the release's rollout has begun its first step; prints its stage and the step.
AT_ROLLOUT = """
import time
import raymodel as rm
rm.init()
job = rm.jobs.get({job!r})
deadline = time.monotonic() + 600
while time.monotonic() < deadline and job.status in ("PENDING", "RUNNING"):
    going = [r.state() for r in rm.serve.rollouts() if r.state()["status"] == "running"]
    if going and going[0]["step"] >= 1:
        print(job.stage, going[0]["step"])
        break
    time.sleep(0.5)
else:
    print("never rolled out:", job.status, job.logs())
"""


class Load:
    """Requests to a route one after another on a thread, until stopped: when each was answered and
    its status (a connection refused while the head is down counts as ``None``)."""

    def __init__(self, url: str, body: dict) -> None:
        import threading

        self.url, self.body, self.answers = url, body, []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                status = requests.post(self.url, json=self.body, timeout=10).status_code
            except requests.RequestException:
                status = None
            self.answers.append((time.time(), status))
            if status != 200:
                time.sleep(0.2)

    def stop(self) -> list:
        self.stopped.set()
        self.thread.join(timeout=30)
        return self.answers


@lane.job("release_restart", expected_s=240)
def _release_restart(scratch: Path) -> dict[str, Any]:
    """`raymodel release` of a registry version, its head stopped and started again while the
    candidate is rolled out: what each step answered."""
    from models import digits_data
    from s3server import free_port

    serve_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYMODEL_", "PYTHONBREAKPOINT"))}
    env.update(
        RAYMODEL_SERVER_FILE=str(scratch / "server.json"),
        RAYMODEL_HOME=str(scratch / "home"),
        RAYMODEL_SERVE_PORT=str(serve_port),
        PYTHONPATH=TESTS,
    )
    cli = [sys.executable, "-m", "raymodel.cli"]
    run = lambda *a: subprocess.run([*cli, *a], env=env, capture_output=True, text=True, timeout=600)  # noqa: E731
    script = lambda text: subprocess.run(  # noqa: E731
        [sys.executable, "-c", text], env=env, capture_output=True, text=True, timeout=600
    )
    ports = ("--port", str(free_port()), "--dashboard-port", str(free_port()))
    steps: dict[str, Any] = {}
    load = None
    try:
        steps["started"] = run("server", "start", *ports, "--num-cpus", "2")
        steps["setup"] = script(SETUP.format(tests=TESTS))
        if steps["started"].returncode or steps["setup"].returncode:
            return steps
        load = Load(f"http://127.0.0.1:{serve_port}/rel", {"pixels": digits_data().splits["valid"].x[:1].tolist()})
        steps["released"] = released = run(
            "release",
            "digits@production",
            "--data",
            "models:digits_data",
            "--set",
            "num_workers=1",
            "--set",
            "num_epochs=3",
            "--set",
            "batch_size=64",
            "--set",
            "lr=0.003",
            "--register",
            "digits",
            "--gate",
            "val_acc",
            "--against",
            "digits@production",
            "--route",
            "/rel",
            "--steps",
            "0.5,1",
            "--step-s",
            "6",
            "--min-requests",
            "5",
        )
        if released.returncode:
            return steps
        steps["job_id"] = job_id = released.stdout.split()[0]
        steps["at_rollout"] = script(AT_ROLLOUT.format(job=job_id))
        steps["down_at"] = time.time()
        steps["down"] = run("server", "stop")  # the head goes down while the candidate is rolled out
        steps["up"] = run("server", "start", *ports, "--num-cpus", "2")
        steps["waited"] = run("jobs", "wait", job_id)
        steps["shown"] = run("jobs", "show", job_id)
        steps["production"] = run("models", "show", "digits@production")
        steps["versions"] = run("models", "list", "digits")
    finally:
        steps["answers"] = load.stop() if load is not None else []
        steps["stopped"] = run("server", "stop")
    return steps


@pytest.mark.integration
@pytest.mark.lane("release_restart")
def test_a_release_from_the_command_line_goes_on_through_a_head_restart_in_its_rollout(lane):
    steps = lane.result("release_restart")
    for name in ("started", "setup", "released"):
        assert steps[name].returncode == 0, (name, steps[name].stdout[-2000:], steps[name].stderr[-3000:])
    assert "submitted: release digits:1 -> digits" in steps["released"].stdout, steps["released"].stdout
    assert steps["at_rollout"].stdout.split()[:1] == ["rollout"], steps["at_rollout"].stdout[-3000:]
    assert steps["down"].returncode == 0 and steps["up"].returncode == 0, steps["up"].stderr[-2000:]
    waited, shown = steps["waited"], steps["shown"].stdout
    assert waited.returncode == 0 and f"{steps['job_id']} SUCCEEDED" in waited.stdout, (waited.stdout, shown)
    assert "release, SUCCEEDED, stage promote" in shown, shown
    for line in ("  train (", "  evaluate (", ": passed", "  register (", ": digits:2", "  rollout (", "promoted"):
        assert line in shown, (line, shown)
    production = steps["production"].stdout
    assert "digits:2" in production or '"version": 2' in production, production
    assert steps["versions"].stdout.count("digits") >= 2, steps["versions"].stdout  # v1 and v2, no third
    # Every request answered before the head went down, and from when the route was served again on.
    answers, down = steps["answers"], steps["down_at"]
    before = [status for at, status in answers if at < down]
    after = [status for at, status in answers if at > down]
    gone = next(i for i, status in enumerate(after) if status != 200)  # the head went down
    back = after.index(200, gone)  # the route is served again (the new head's Serve answered 404 until then)
    assert before.count(200) > 10 and set(before) == {200}, _runs(answers, down)
    assert after[back:].count(200) > 10 and set(after[back:]) == {200}, _runs(answers, down)


def _runs(answers: list[tuple[float, Any]], down: float) -> list[str]:
    """The answers as runs of one status: ``"200 x41 from -12.3 s"`` (seconds from the head's stop)."""
    runs: list[list[Any]] = []
    for at, status in answers:
        if runs and runs[-1][0] == status:
            runs[-1][1] += 1
        else:
            runs.append([status, 1, at - down])
    return [f"{status} x{n} from {t:+.1f} s" for status, n, t in runs]


@pytest.mark.integration
@pytest.mark.beside  # rollouts' steps and jobs' waits: the second session (tests/beside.py)
def test_a_tuned_release_gates_the_best_trial_and_a_stop_in_its_rollout_leaves_the_route_as_it_was(released):
    """`tune=`: the best trial's checkpoint (with its config) is the candidate; `job.stop()` during the
    rollout sets the route back to what it served; the dashboard's job view has the stages."""
    from models import DigitsNet

    from raymodel.web import _api

    production = rm.registry.show("digits", "production").version
    clients = Clients(released["served"].url, released["body"], n=2)
    try:
        job = DigitsNet().release(
            data=released["data"],
            tune=rm.TuneSettings(
                num_samples=1, max_epochs=2, scheduler="fifo", progress=False, train={"batch_size": 64}
            ),
            space={"hidden": rm.tune.grid_search([32, 48]), "lr": 3e-3},
            register="digits",
            gate=rm.Gate(metric="val_acc", against="digits@production", min_delta=-1.0),
            route="/release",
            rollout=rm.RolloutPlan(steps=(0.5, 1.0), step_s=600, guard=rm.Guard(min_requests=5)),
            wait=False,
        )
        until(lambda: job.stage == "rollout" and running_rollouts() and running_rollouts()[0].state()["step"] == 1, 300)
        job.stop()
        result = job.wait(timeout=120)
    finally:
        clients.stop()
    assert result.status == "STOPPED" and "stopped at step 1" in result.reason, result
    tuned = result.stage("train")["tuned"]
    assert tuned["trials"] == 2 and tuned["config"]["hidden"] in (32, 48), tuned
    trial_rows = [row for row in job.history() if "trial_id" in row]
    assert len(trial_rows) == 4 and {row["stage"] for row in trial_rows} == {"train"}  # 2 trials, 2 epochs
    version = result.version
    assert rm.registry.show(version).lineage["config"]["hidden"] == tuned["config"]["hidden"]
    info = requests.get(released["served"].url + "/info", timeout=30).json()
    assert info["split"] == {"digits@production": 1.0} and info["serving"] == f"digits:{production}"
    assert rm.registry.show("digits", "production").version == production
    view = _api.job(job.id)  # the dashboard's job view: the stages apart from the curves' rows
    assert [s["stage"] for s in view["stages"]] == ["train", "evaluate", "register", "rollout"], view["stages"]
    assert "passed" in view["stages"][1]["text"] and all("end" not in row for row in view["history"])
