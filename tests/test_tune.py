"""`model.tune()` on real Ray Tune: every trial is an ordinary training run."""

from __future__ import annotations

import json
import time

import pytest
from interrupt import StopAfter
from models import DigitsNet, TinyNet

import raymodel as rm
from raymodel.exceptions import SettingsError, TuneError

TRIAL = {"resources_per_worker": {"CPU": 0.95}, "batch_size": 64}


class SpacedDigits(DigitsNet):
    def hyperparameter_space(self):
        return {"lr": rm.tune.grid_search([1e-2, 3e-3, 1e-4, 1e-5])}


def _free_cpus_eventually(ray, expected: float, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= expected - 1e-6 or time.monotonic() > deadline:
            return free


@pytest.mark.integration
def test_asha_stops_poor_trials_early_and_the_best_is_loaded(ray_session, digits):
    X, y = digits
    data = rm.data.from_numpy(X, y, valid_fraction=0.2)
    model = SpacedDigits()
    # The grid twice: whatever order trials run in, poor ones reach a rung after good ones.
    settings = rm.TuneSettings(
        num_samples=2, max_epochs=3, grace_period=1, reduction_factor=2, metric="val_loss", mode="min", train=TRIAL
    )
    result = model.tune(settings=settings, data=data)  # space=None: hyperparameter_space()

    frame = result.dataframe()
    assert result.num_trials == 8 == len(frame)  # the default space's grid of 4 learning rates, twice
    assert sorted(frame["config/lr"]) == sorted([1e-5, 1e-4, 3e-3, 1e-2] * 2)
    assert frame["stopped_early"].any(), "ASHA stopped no trial"
    assert (frame.loc[frame["stopped_early"], "epochs"] < 3).all()
    assert (frame["epochs"] == 3).any()
    assert {"val_loss", "val_acc", "loss", "epochs", "stopped_early"} <= set(frame.columns)
    assert result.best_metrics["val_loss"] == frame["val_loss"].min()
    # The instance now holds the best trial's config and weights.
    assert model.config["lr"] == result.best_config["lr"] in (3e-3, 1e-2)
    valid = data.splits["valid"]
    accuracy = (model.predict({"pixels": valid.x.tolist()})["digit"] == valid.y).mean()
    assert accuracy == pytest.approx(result.best_metrics["val_acc"], abs=1e-6)
    # Every CPU is free again once tune() returns (ray-project/ray#54305, #47439).
    assert _free_cpus_eventually(ray_session, 2.0) == pytest.approx(2.0)


@pytest.mark.integration
def test_an_interrupted_experiment_resumes_where_it_stopped(ray_session, tiny):
    X, y = tiny
    data = rm.data.from_numpy(X, y, valid_fraction=0.25)
    space = {"lr": rm.tune.grid_search([0.01, 0.02, 0.03, 0.04])}
    settings = dict(
        num_samples=1, max_epochs=2, scheduler="fifo", name="resumable", max_concurrent_trials=1, train=TRIAL
    )
    first = TinyNet().tune(space, settings={**settings, "callbacks": [StopAfter(2)]}, data=data)
    finished_first = first.dataframe()
    finished_first = finished_first[finished_first["epochs"] == 2]
    assert 2 <= len(finished_first) < 4

    with pytest.raises(SettingsError, match="already exists"):
        TinyNet().tune(space, settings=settings, data=data)

    resumed = TinyNet().tune(space, settings=settings, data=data, resume=True)
    frame = resumed.dataframe().set_index("trial_id")
    assert resumed.num_trials == 4 and (frame["epochs"] == 2).all()
    assert sorted(frame["config/lr"]) == [0.01, 0.02, 0.03, 0.04]
    for trial_id, row in finished_first.set_index("trial_id").iterrows():
        assert frame.loc[trial_id, "val_loss"] == row["val_loss"], "a finished trial was run again"


@pytest.mark.integration
def test_a_searcher_passed_in_is_used(ray_session, tiny):
    from ray.tune.search.basic_variant import BasicVariantGenerator

    X, y = tiny
    searcher = BasicVariantGenerator(points_to_evaluate=[{"lr": 0.0123}])
    result = TinyNet().tune(
        {"lr": rm.tune.uniform(0.1, 0.2)},
        data=rm.data.from_numpy(X, y),
        settings={"num_samples": 1, "max_epochs": 1, "search_alg": searcher, "train": TRIAL},
    )
    assert result.best_config["lr"] == 0.0123


def test_tune_settings_are_validated_before_ray(tiny):
    with pytest.raises(SettingsError, match="Did you mean `num_samples`"):
        rm.TuneSettings(num_sample=3)
    with pytest.raises(SettingsError, match="`scheduler` must be one of 'asha', 'fifo'"):
        rm.TuneSettings(scheduler="hyperband")
    with pytest.raises(SettingsError, match=r"(?s)`train`: .*`num_workers` must be an int from 0 to 10000 \(got -3\)"):
        rm.TuneSettings(train={"num_workers": -3})
    with pytest.raises(SettingsError, match="`grace_period` \\(5\\) must be <= `max_epochs` \\(3\\)"):
        rm.TuneSettings(grace_period=5, max_epochs=3)
    X, y = tiny
    with pytest.raises(SettingsError, match="no `valid` split"):
        TinyNet().tune({}, settings={"metric": "val_acc"}, data={"train": (X, y)})
    with pytest.raises(TuneError, match="Nothing to resume"):
        TinyNet().tune({}, settings={"name": "never-started"}, data=rm.data.from_numpy(X, y), resume=True)


@pytest.mark.integration
def test_a_metric_the_model_never_reports_names_the_ones_it_does(ray_session, tiny):
    X, y = tiny
    with pytest.raises(TuneError, match=r"No trial reported `val_f1`. The model reports: \[.*'val_acc', 'val_loss'\]"):
        TinyNet().tune(
            {},
            settings={"num_samples": 1, "max_epochs": 1, "metric": "val_f1", "train": TRIAL},
            data=rm.data.from_numpy(X, y),
        )


class ControllerCount(rm.Callback):
    """Records, each epoch, how many Ray Train controllers are alive and the worker's process id."""

    def __init__(self, path: str, before: set[str]) -> None:
        self.path, self.before = path, before  # controllers alive before the experiment (other tests')

    def after_epoch(self, epoch, metrics):
        if self.context.rank == 0:
            alive = _controllers() - self.before
            with open(self.path, "a") as fh:
                fh.write(json.dumps([self.context.trial_id, self.context.world_size, len(alive)]) + "\n")


def _controllers() -> set[str]:
    from ray.util.state import list_actors

    return {a.actor_id for a in list_actors(filters=[("class_name", "=", "TrainController"), ("state", "=", "ALIVE")])}


@pytest.mark.integration
@pytest.mark.beside  # mostly waits: in the second session, while this one computes (tests/beside.py)
def test_single_worker_trials_train_in_the_trial_and_match_a_worker_group(ray_session, tmp_path, tiny):
    X, y = tiny
    data = rm.data.from_numpy(X, y, valid_fraction=0.25)
    rm.jobs.release_pools()  # the 2-worker trial's pool (a Train controller of its own) is started for it
    log = tmp_path / "controllers.jsonl"
    settings = {
        "num_samples": 1,
        "max_epochs": 2,
        "scheduler": "fifo",
        "max_concurrent_trials": 1,
        "progress": False,
        "train": {**TRIAL, "batch_size": 4, "callbacks": [ControllerCount(str(log), _controllers())]},
    }
    result = TinyNet().tune({"train.num_workers": rm.tune.grid_search([0, 1, 2])}, settings=settings, data=data)
    seen = {}
    for trial_id, world, controllers in (json.loads(line) for line in log.read_text().splitlines()):
        seen.setdefault(trial_id, set()).add((world, controllers))
    by_workers = {row["config/train.num_workers"]: seen[row["trial_id"]] for _, row in result.dataframe().iterrows()}
    assert by_workers == {0: {(1, 0)}, 1: {(1, 0)}, 2: {(2, 1)}}  # no worker group unless there are 2 workers

    # The trial with one worker trained exactly as a Ray Train worker group of one does.
    frame = result.dataframe()
    checkpoint = frame.loc[frame["config/train.num_workers"] == 1, "checkpoint"].item()
    in_trial = json.loads(open(f"{checkpoint}/raymodel.json").read())["history"]
    grouped = TinyNet().train({"num_workers": 1, "num_epochs": 2, "batch_size": 4, "progress": False}, data=data)
    assert [row["epoch"] for row in in_trial] == [1, 2]
    for a, b in zip(in_trial, grouped.history):
        assert a == pytest.approx(b, rel=1e-6)
