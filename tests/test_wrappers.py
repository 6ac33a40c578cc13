"""`Trainable`, `Tunable`, `Servable`: the wrappers behind the verbs, with native Ray underneath."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import torch
from models import DigitsNet, TinyNet

import raymodel as rm

pytestmark = pytest.mark.integration
PYTHON = sys.executable
ROOT = Path(__file__).resolve().parent.parent
TRIAL = {"resources_per_worker": {"CPU": 0.95}, "batch_size": 8}


def test_drivers_do_not_import_the_model_module_and_it_imports_them_only_when_called():
    def runtime_imports(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []  # annotations only
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        return found

    package = ROOT / "raymodel"
    for folder in ("train", "tune", "serve", "registry"):
        for path in (package / folder).glob("*.py"):
            assert "raymodel.model" not in runtime_imports(path), path
    top_level = {
        n.module
        for n in ast.parse((package / "model.py").read_text()).body
        if isinstance(n, ast.ImportFrom) and n.module
    }
    assert not top_level & {"raymodel.train", "raymodel.tune", "raymodel.serve", "raymodel.registry"}


@pytest.mark.parametrize(
    "module,cls,native",
    [
        ("torch_digits", "ScheduledDigitsNet", "ray.train.torch.TorchTrainer"),
        ("lightning_digits", "LightningDigits", "ray.train.torch.TorchTrainer"),
        ("keras_iris", "KerasIris", "ray.train.tensorflow.TensorflowTrainer"),
        ("xgboost_breast_cancer", "XGBCancer", "ray.train.xgboost.XGBoostTrainer"),
        ("lightgbm_breast_cancer", "LGBMCancer", "ray.train.lightgbm.LightGBMTrainer"),
    ],
)
def test_as_trainer_is_the_native_trainer_of_each_backend(ray_session, module, cls, native):
    sys.path.insert(0, str(ROOT / "examples"))
    example = importlib.import_module(module)
    trainer = rm.Trainable(getattr(example, cls)(), {"num_workers": 2}, data=example.load_data()).as_trainer()
    name, _, klass = native.rpartition(".")
    assert type(trainer) is getattr(importlib.import_module(name), klass)


def test_the_native_trainer_runs_the_same_loop_as_model_train(ray_session, tiny):
    X, y = tiny
    data = rm.data.from_numpy(X, y, valid_fraction=0.25)
    settings = {"num_workers": 2, "num_epochs": 3, "batch_size": 4, "progress": False}
    by_verb = TinyNet().train(settings, data=data)  # which is `rm.Trainable(...).fit()` (model.py)
    result = rm.Trainable(TinyNet(), settings, data=data).as_trainer().fit()  # Ray's own Result
    restored = rm.RayModel.from_checkpoint(result.checkpoint.path)
    np.testing.assert_allclose(
        np.asarray(restored.predict(X)), np.asarray(TinyNet.from_checkpoint(by_verb.checkpoint).predict(X)), rtol=1e-6
    )


class StepCounter(rm.Callback):
    """Records each epoch's number of steps and the trial's batch size (one line per epoch, rank 0)."""

    def __init__(self, path: str) -> None:
        self.path, self.steps = path, 0

    def before_epoch(self, epoch):
        self.steps = 0

    def after_batch(self, batch_idx, outputs):
        self.steps += 1

    def after_epoch(self, epoch, metrics):
        if self.context.rank == 0:
            with open(self.path, "a") as fh:
                fh.write(json.dumps([self.context.trial_id, epoch, self.steps]) + "\n")


def test_train_settings_are_tunable_per_trial(ray_session, tmp_path, tiny):
    X, y = tiny  # 12 training rows: batch 2 -> 6 steps an epoch, batch 6 -> 2
    log = tmp_path / "steps.jsonl"
    settings = {
        "num_samples": 1,
        "max_epochs": 2,
        "scheduler": "fifo",
        "progress": False,
        "train": {**TRIAL, "callbacks": [StepCounter(str(log))]},
    }
    result = TinyNet().tune(
        {"train.batch_size": rm.tune.grid_search([2, 6])},
        settings=settings,
        data=rm.data.from_numpy(X, y, valid_fraction=0.25),
    )
    frame = result.dataframe()
    assert sorted(frame["config/train.batch_size"]) == [2, 6]
    assert "train.batch_size" in result.best_config
    steps = {}
    for trial_id, _epoch, n in (json.loads(line) for line in log.read_text().splitlines()):
        steps.setdefault(trial_id, set()).add(n)
    by_batch = {row["config/train.batch_size"]: steps[row["trial_id"]] for _, row in frame.iterrows()}
    assert by_batch == {2: {6}, 6: {2}}
    with pytest.raises(rm.SettingsError, match="'train.nope' names no tunable training setting"):
        TinyNet().tune({"train.nope": rm.tune.choice([1])}, data=rm.data.from_numpy(X, y))


class LoadRecorder(rm.Callback):
    """On every restore: the trial, the epoch and checkpoint it resumed from, and the loaded weights."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _write(self, event):
        if self.context.rank == 0:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(event) + "\n")

    def on_load_checkpoint(self, state):
        weights = sum(float(p.double().sum()) for p in self.model.net.parameters())
        self._write(
            {
                "trial": self.context.trial_id,
                "from": self.context.checkpoint,
                "epoch": self.context.resumed_from,
                "weights": weights,
            }
        )

    def before_epoch(self, epoch):
        self._write({"trial": self.context.trial_id, "before_epoch": epoch})


def _exploits(log: Path, last_epoch: int) -> list[tuple[dict, int]]:
    """Each restore from another trial's checkpoint before the last epoch, with the epoch its trial ran next."""
    events = [json.loads(line) for line in log.read_text().splitlines()]
    found = []
    for i, event in enumerate(events):
        if "from" in event and event["trial"] not in event["from"] and event["epoch"] < last_epoch:
            following = next(
                e["before_epoch"] for e in events[i + 1 :] if e["trial"] == event["trial"] and "before_epoch" in e
            )
            found.append((event, following))
    return found


def _donor_weights(checkpoint: str) -> float:
    state = torch.load(Path(checkpoint) / "state" / "model.pt", weights_only=False)
    return sum(float(t.double().sum()) for t in state["modules"]["net"].values())


def _check_exploits(log: Path, last_epoch: int = 4) -> None:
    exploits = _exploits(log, last_epoch)
    assert exploits, "PBT never exploited"
    for event, next_epoch in exploits:
        assert next_epoch == event["epoch"] + 1  # continues the donor's epochs, not from 1
        assert event["weights"] == pytest.approx(_donor_weights(event["from"]), rel=1e-9)  # the donor's weights


def test_population_based_training_exploits_from_the_donors_checkpoint(ray_session, tmp_path, digits):
    X, y = digits
    log = tmp_path / "loads.jsonl"
    space = {"lr": rm.tune.choice([1e-5, 3e-2])}  # one good, one hopeless: the hopeless trial exploits
    settings = {
        "num_samples": 2,
        "max_epochs": 4,
        "scheduler": "pbt",
        "perturbation_interval": 2,
        "progress": False,
        "seed": 1,
        "train": {**TRIAL, "batch_size": 64, "callbacks": [LoadRecorder(str(log))]},
    }
    DigitsNet().tune(space, settings=settings, data=rm.data.from_numpy(X[:500], y[:500]))
    _check_exploits(log)


@pytest.mark.beside  # mostly waits: in the second session, while this one computes (tests/beside.py)
def test_as_trainable_runs_under_a_users_own_tuner(ray_session, tmp_path, tiny, digits):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    X, y = tiny
    asha = tune.Tuner(
        rm.Tunable(TinyNet(), data=rm.data.from_numpy(X, y), settings={"train": TRIAL}).as_trainable(),
        param_space={"lr": tune.grid_search([0.5, 0.05, 0.005]), "train.num_epochs": 3},
        tune_config=tune.TuneConfig(
            scheduler=ASHAScheduler(time_attr="epoch", metric="val_loss", mode="min", max_t=3, grace_period=1),
            max_concurrent_trials=2,
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "asha"), name="users-asha"),
    ).fit()
    assert len(asha) == 3 and not asha.errors
    assert all(0 < r.metrics["epoch"] <= 3 for r in asha)
    best = rm.RayModel.from_checkpoint(asha.get_best_result("val_loss", "min").metrics["checkpoint_path"])
    assert best.config["lr"] in (0.5, 0.05, 0.005)

    X, y = digits
    log = tmp_path / "loads.jsonl"
    tunable = rm.Tunable(
        DigitsNet(),
        data=rm.data.from_numpy(X[:500], y[:500]),
        settings={"train": {**TRIAL, "batch_size": 64, "callbacks": [LoadRecorder(str(log))]}},
    )
    pbt = PopulationBasedTraining(
        time_attr="epoch",
        metric="val_loss",
        mode="min",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [1e-5, 3e-2]},
        synch=True,
    )
    grid = tune.Tuner(
        tunable.as_trainable(),
        param_space={"lr": tune.grid_search([1e-5, 3e-2]), "train.num_epochs": 4},
        tune_config=tune.TuneConfig(scheduler=pbt),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "pbt"), name="users-pbt"),
    ).fit()
    assert not grid.errors
    _check_exploits(log)


# ---------------------------------------------------------------------- serving
@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMODEL_REGISTRY", str(tmp_path / "registry"))
    return rm.registry.open()


def _versions(registry):
    """Two versions of `digits` whose answers tell them apart: version 1 says 0 for everything, 2 says 9."""
    for digit in (0, 9):
        model = DigitsNet()
        model.ensure_setup()
        with torch.no_grad():
            for p in model.net.parameters():
                p.zero_()
            model.net[-1].bias[digit] = 1.0
        registry.put(model, key="digits", alias="production" if digit == 0 else None)


def test_as_application_runs_under_serve_run(ray_session, registry, digits):
    from ray import serve

    _versions(registry)
    app = rm.Servable("digits:2", "/by-version").as_application()
    serve.run(app, name="by-version", route_prefix="/by-version")
    try:
        answer = requests.post("http://127.0.0.1:8000/by-version", json={"pixels": digits[0][:2].tolist()}, timeout=60)
        assert answer.status_code == 200 and answer.json() == {"digit": [9, 9]}
        assert answer.headers["x-raymodel-model"] == "digits:2"
    finally:
        serve.delete("by-version")


def test_an_alias_switch_under_load_fails_no_request(ray_session, registry, digits):
    _versions(registry)
    served = rm.Servable(
        "digits@production",
        "/switch",
        settings={"registry_poll_s": 0.2, "num_replicas": 2, "ray_actor_options": {"num_cpus": 0.25}},
    ).deploy()
    session = requests.Session()
    row = {"pixels": digits[0][:1].tolist()}
    statuses, seen = [], []
    try:
        while len(statuses) < 300 or seen[-50:] != ["digits:2"] * 50:
            if len(statuses) == 100:
                rm.registry.set_alias("digits", "production", 2)
            answer = session.post(served.url, json=row, timeout=60)
            statuses.append(answer.status_code)
            seen.append(answer.headers.get("x-raymodel-model"))
            assert answer.json()["digit"] == [0 if seen[-1] == "digits:1" else 9]
            assert len(statuses) < 3000, "the replicas never switched"
    finally:
        served.shutdown()
    assert set(statuses) == {200}
    assert seen[:100] == ["digits:1"] * 100 and "digits:2" in seen


def _wait_for(url: str, proc: subprocess.Popen, timeout: float = 120) -> requests.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, _said(proc)
        try:
            answer = requests.get(url, timeout=5)
            if answer.status_code == 200:
                return answer
        except (requests.ConnectionError, requests.Timeout):  # not up yet, or HAProxy queued the request
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} never answered; where the command is: {_stacks(proc)}")


def _said(proc: subprocess.Popen) -> str:
    """What a command wrote to its stderr file (never a pipe: Ray's logs would fill it, and the command
    would block writing to it before it printed its own line)."""
    return Path(proc.err_path).read_text() if hasattr(proc, "err_path") else "exited"


def _first_line(proc: subprocess.Popen, timeout: float = 180) -> str:
    import select

    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no line on stdout in {timeout} s; stderr: {_said(proc)[-2000:]}; where it is: {_stacks(proc)}"
    return proc.stdout.readline()


def _stacks(proc: subprocess.Popen) -> str:
    """Where a command that has not answered is (py-spy's dump of its threads), for the failure's message."""
    spy = Path(PYTHON).parent / "py-spy"
    try:
        out = subprocess.run([str(spy), "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(py-spy: {exc})"
    return (out.stdout + out.stderr)[-6000:]


def _start(args: list[str], env: dict[str, str], err: Path, stdout: Any) -> subprocess.Popen:
    with open(err, "w") as fh:
        proc = subprocess.Popen(args, env=env, stdout=stdout, stderr=fh, text=True)
    proc.err_path = str(err)
    return proc


def test_serving_from_the_command_lines(ray_session, registry, tmp_path):
    _versions(registry)
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    # `serve run` (Ray's own CLI) on a module that builds the application.
    (tmp_path / "served_app.py").write_text(
        "import raymodel as rm\napp = rm.Servable('digits@production', '/ray-cli').as_application()\n"
    )
    proc = _start(
        [
            str(Path(PYTHON).parent / "serve"),
            "run",
            "served_app:app",
            "--route-prefix",
            "/ray-cli",
            "--app-dir",
            str(tmp_path),
        ],
        env,
        tmp_path / "serve-run.err",
        subprocess.DEVNULL,
    )
    try:
        assert _wait_for("http://127.0.0.1:8000/ray-cli/info", proc).json()["serving"] == "digits:1"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    from ray import serve

    # Killed, `serve run` leaves its application running (Ctrl-C would shut all of Serve down): its
    # replica's CPU is one of the session's two, which the next command's replica needs.
    serve.delete("default")
    # `raymodel serve` (ours), which stops serving cleanly on SIGTERM.
    proc = _start(
        [PYTHON, "-m", "raymodel.cli", "serve", "digits:2", "--route", "/our-cli"],
        env,
        tmp_path / "our-serve.err",
        subprocess.PIPE,
    )
    try:
        line = _first_line(proc)  # the host is Serve's (127.0.0.1, or 0.0.0.0 when this test starts Serve)
        assert line.startswith("serving digits:2 at http://") and ":8000/our-cli" in line, line
        assert _wait_for("http://127.0.0.1:8000/our-cli/info", proc).json()["serving"] == "digits:2"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert "stopped serving digits:2" in out, _said(proc)
    assert requests.get("http://127.0.0.1:8000/our-cli/info", timeout=10).status_code == 404  # shut down
