"""The seven built-in backends through the one conformance suite (`conformance.py`).

A backend joins the suite with its line in `CASES`; a built-in backend without one fails
`test_every_built_in_backend_has_a_case`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import shared_runs
from conformance import TRIAL, Case, install
from rl_models import Balancer, QuickBalancer, play

import raymodel as rm

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))
import lightning_digits  # noqa: E402 - from examples/
import torch_digits  # noqa: E402

RL_EPOCHS, RL_MIN_RETURN = 5, 60.0  # a random policy: about 22; after 5 iterations, 120 measured

CASES = [
    Case.example(
        "torch",
        "torch_digits",
        payload=lambda rows: {"pixels": rows.tolist()},
        numbers=lambda answer: answer["digit"],
        batch_numbers=lambda columns: columns["prediction"].argmax(1),
        bad_payload=lambda rows: {"pixels": np.asarray(rows)[:, :-1].tolist()},  # 63 pixels of 64
    ),
    # Lightning's `sync_dist` averages the 2 workers' means of their unequal halves of the validation
    # split (180 and 179 rows): 1 row's weight off the whole split's mean that scoring reports.
    Case.example("lightning", "lightning_digits", scored_abs=0.005, between=lambda: digits_job()),
    Case.example("tensorflow", "keras_iris"),
    Case.example("xgboost", "xgboost_breast_cancer"),
    Case.example("lightgbm", "lightgbm_breast_cancer"),
    Case(
        "rllib",
        train=lambda **settings: rl_train(**settings),
        train_interrupted=lambda **settings: rl_train(QuickBalancer(), **settings),  # rows and hooks, not returns
        tuned=QuickBalancer,  # trials and their route, not their returns
        accuracy=lambda model, data: play(model),  # the greedy policy's mean return on CartPole
        min_accuracy=RL_MIN_RETURN,
        rows=lambda data, n: np.random.default_rng(0).uniform(-0.2, 0.2, (n, 4)).astype(np.float32),
        payload=lambda rows: {"obs": np.asarray(rows).tolist()},
        numbers=lambda answer: answer["action"],
        batch_numbers=lambda columns: columns["action"],
        bad_payload=lambda rows: {"obs": np.asarray(rows)[:, :-1].tolist()},  # CartPole observes 4 values
        ranks=(0,),  # one Algorithm's actor: its learner is rank 0; env runners run no hooks
        crash_rank=0,
        tune_train={"num_workers": 1},  # a trial holds the Algorithm's CPU and its env runner's
        not_applicable={
            "used_pool": "RLlib's runs are an Algorithm in an actor of raymodel's (its `training` is an `OwnRuns`), "
            "never a job on a pool of Ray Train workers",
            "same_model_after_resume": "a restarted Algorithm's env runners start new episodes (an environment's "
            "state is in no checkpoint), so after the restart it samples other steps and its weights differ",
        },
    ),
    Case(
        "transformers",
        train=lambda **settings: hf_train(**settings),
        accuracy=lambda model, data: hf_accuracy(model, data),
        min_accuracy=0.9,
        rows=lambda data, n: list(data["validation"]["text"][:n]),
        payload=lambda rows: {"text": list(rows)},
        numbers=lambda answer: answer["score"],
        batch_numbers=lambda columns: columns["score"],
        bad_payload=lambda rows: {"text": [[0.1, 0.2]]},  # numbers where text goes
        table=lambda rows: ray_data().from_items([{"text": t} for t in rows], override_num_blocks=6),
        set_up_on_driver=True,
        shared=True,  # test_transformers' tiny-BERT test checks this run too
        tune_train={**TRIAL, "batch_size": 16},  # each trial trains in its actor, as every case's does
        between=lambda: lightning_digits.train(num_epochs=1, progress=False),
    ),
]
install(globals(), CASES)


def digits_job():
    """The torch example, 2 epochs: between two Lightning jobs on their pool (torch's kind: both frameworks')."""
    model, result, _ = torch_digits.train(num_epochs=2, progress=False)
    assert [row["epoch"] for row in result.history] == [1, 2]


def rl_train(model=None, **settings):
    """PPO on CartPole with one env runner, for `RL_EPOCHS` iterations."""
    model = Balancer() if model is None else model
    result = model.train({"num_workers": 1, "num_epochs": RL_EPOCHS, **settings})
    return model, result, None


def hf_train(**settings):
    """A tiny BERT classifier on the generated sentiment set, two workers, three epochs (test_transformers
    checks the case's run too)."""
    return shared_runs.sentiment(**settings)


def hf_accuracy(model, data) -> float:
    valid = data["validation"]
    return float(np.mean(np.asarray(model.predict({"text": valid["text"]})["label"]) == np.asarray(valid["label"])))


def ray_data():
    import ray.data

    return ray.data


def test_every_built_in_backend_has_a_case():
    """The case list is the package's backend table: a built-in backend without a case fails here."""
    from raymodel.contract import backends

    built_in = {b.name for b in backends() if type(b).__module__.startswith("raymodel.backends.")}
    assert built_in == {case.backend for case in CASES}
    assert len(CASES) == len({case.backend for case in CASES}) == 7


def test_a_missing_framework_names_the_extra(monkeypatch):
    from raymodel.backends.xgboost import XGBoostBackend
    from raymodel.exceptions import MissingDependencyError

    monkeypatch.setitem(sys.modules, "xgboost", None)  # what an uninstalled package looks like to import
    with pytest.raises(MissingDependencyError, match=r"pip install 'raymodel\[xgboost\]'"):
        XGBoostBackend().import_framework()
    monkeypatch.setitem(sys.modules, "tf_keras", None)
    from raymodel.backends.tensorflow import TensorflowBackend

    with pytest.raises(MissingDependencyError, match=r"pip install 'raymodel\[tensorflow\]'"):
        TensorflowBackend().import_framework()


def test_a_backend_carries_only_the_capabilities_it_has():
    """Training, inference and text generation are parts of a backend (``contract/_training.py``,
    ``_inference.py``, ``_generation.py``): the backend itself carries none of their members, a backend
    whose runs are its own (RLlib's) carries no Ray Train trainer or collective, one on Ray Train no run
    type of its own, and only a backend that generates text has a text part."""
    from raymodel.contract import Backend, Inference, OwnRuns, RayTrain, Training, backends

    parts = {
        Training: ("worker_loop", "needs"),
        RayTrain: ("trainer", "collective", "options", "own", "make_trainer"),
        OwnRuns: ("make_run", "trial_bundles"),
        Inference: ("forward", "preprocess", "postprocess", "mode", "stream", "batch_input", "batch_output", "stack"),
    }
    named = {name for members in parts.values() for name in members} | {"engine", "attach_adapter", "on_ray_train"}
    kinds: dict[str, set[str]] = {}
    for backend in backends():
        assert not named & set(dir(backend)), (backend.name, sorted(named & set(dir(backend))))
        training = backend.training
        assert isinstance(training, (RayTrain, OwnRuns)) and isinstance(backend.inference, Inference)
        other = OwnRuns if isinstance(training, RayTrain) else RayTrain
        assert not set(parts[other]) & set(dir(training)) - set(parts[Training]), (backend.name, training)
        kinds.setdefault("RayTrain" if isinstance(training, RayTrain) else "OwnRuns", set()).add(backend.name)
        assert (backend.text is not None) == (backend.name == "transformers"), backend.name
    assert kinds["OwnRuns"] == {"rllib"} and "torch" in kinds["RayTrain"]
    assert not named & set(dir(Backend))


def test_a_backend_without_training_is_refused_where_its_model_class_is_defined():
    from raymodel.contract import Backend
    from raymodel.exceptions import ModelDefinitionError

    class NoTraining(Backend):
        name = "no-training"

    with pytest.raises(ModelDefinitionError, match=r"`NoTraining` declares no `training`: set `training = RayTrain"):

        class RayNoTrainingModel(rm.RayModel):
            backend = NoTraining()

    assert "RayNoTrainingModel" not in rm.contract.model_classes()


def test_a_worker_loop_named_other_than_module_colon_class_is_refused():
    from raymodel.contract import RayTrain
    from raymodel.exceptions import ModelDefinitionError

    for loop in ("my_plugin.loop.MyLoop", "my_plugin.loop:", 42):
        with pytest.raises(
            ModelDefinitionError,
            match=r"worker loop must be a callable or its class as 'module:Class'",
        ):
            RayTrain(loop)


def test_drivers_never_ask_which_backend_they_hold():
    root = Path(rm.__file__).parent
    for folder in ("train", "tune", "serve", "registry"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            for case in CASES:
                name = case.backend
                assert f'backend == "{name}"' not in text and f'backend.name == "{name}"' not in text, path


@pytest.mark.integration
@pytest.mark.after("test_a_used_pool_trains_exactly_as_a_fresh_one[lightning]")  # on that case's idle pool
def test_lightnings_own_boring_model_trains_unchanged(ray_session):
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Boring(rm.RayLightningModel):
        def setup(self, config):
            return BoringModel()  # Lightning's own test model, not a line changed

    model = Boring()
    result = model.train(
        {"num_workers": 2, "num_epochs": 2, "batch_size": 8, "progress": False},
        data={"train": RandomDataset(32, 64), "valid": RandomDataset(32, 16)},
    )
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert np.isfinite(result.history[-1]["loss"])
    assert np.asarray(model.predict(np.ones((3, 32), dtype=np.float32))).shape == (3, 2)
