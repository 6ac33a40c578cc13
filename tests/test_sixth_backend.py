"""A sixth backend, defined only in this file, through the same conformance suite.

scikit-learn's `SGDClassifier` trained with `partial_fit` (one pass over the worker's shard per
epoch) on 2 Ray workers of Train V2's `DataParallelTrainer`, with the parameters averaged across
workers after every epoch. Nothing outside this file knows about it: the backend table, the
checkpoint format, pickling, the drivers, tune, serve and the registry take it as it is.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
from conformance import Case, install
from sklearn.datasets import load_digits

import raymodel as rm
from raymodel.contract import Backend, Inference, RayTrain, WorkerLoop
from raymodel.data import worker_rows


class SGDInference(Inference):
    def forward(self, model, x):
        return model.estimator.predict_proba(np.asarray(x, dtype=np.float64))


class SGDBackend(Backend):
    name = "sklearn-sgd"
    extra = "sklearn"
    imports = ("sklearn",)
    packages = ("scikit-learn",)
    accepts = ("arrays",)
    hook_notes = {"before_batch": "no (one `partial_fit` per epoch)", "after_batch": "no (one `partial_fit` per epoch)"}
    state_keys = ("estimator",)
    training = RayTrain(loop=lambda run: SGDLoop(run))
    inference = SGDInference()

    def after_user_setup(self, model, returned):
        model.estimator = returned

    def get_state(self, model):
        return {"estimator": model.estimator}

    def write_state(self, model, state, directory: Path):
        (directory / "estimator.pkl").write_bytes(pickle.dumps(state["estimator"]))  # scikit-learn's own way

    def read_state(self, model, directory: Path):
        return {"estimator": pickle.loads((directory / "estimator.pkl").read_bytes())}

    def set_state(self, model, state):
        model.estimator = state["estimator"]


class SGDLoop(WorkerLoop):
    def build(self):
        run, s = self.run, self.run.settings
        self.classes = np.unique(np.asarray(run.splits["train"].y))
        self.rows = {}
        for name, split in run.splits.items():
            idx = worker_rows(len(split), run.rank, run.world, train=name == "train", shuffle=s.shuffle, seed=s.seed)
            self.rows[name] = (np.asarray(split.x, dtype=np.float64)[idx], np.asarray(split.y)[idx])

    async def train_epoch(self, epoch):
        estimator = self.model.estimator
        x, y = self.rows["train"]
        estimator.partial_fit(x, y, classes=self.classes)
        # Parameter averaging: every worker takes the mean of all workers' coefficients.
        parts = self.run.collective.all_gather((estimator.coef_, estimator.intercept_))
        estimator.coef_ = np.mean([c for c, _ in parts], axis=0)
        estimator.intercept_ = np.mean([i for _, i in parts], axis=0)
        return self._metrics("train")

    async def validate(self, epoch):
        return self._metrics("valid")

    def _metrics(self, name):
        from sklearn.metrics import log_loss

        x, y = self.rows[name]
        proba = self.model.estimator.predict_proba(x)
        n = len(y)
        loss = log_loss(y, proba, labels=self.classes)
        acc = float((self.classes[proba.argmax(1)] == y).mean())
        return self.run.mean_over_workers({"loss": (loss * n, n), "acc": (acc * n, n)})


class RaySGDModel(rm.RayModel):
    """The sixth backend's model base class: `setup` returns an unfitted `SGDClassifier`."""

    backend = SGDBackend()


class DigitsSGD(RaySGDModel):
    default_config = {"alpha": 1e-4}

    def setup(self, config):
        from sklearn.linear_model import SGDClassifier

        return SGDClassifier(loss="log_loss", alpha=config["alpha"], random_state=0)

    def hyperparameter_space(self):
        return {"alpha": rm.tune.loguniform(1e-5, 1e-2)}


def load_data():
    X, y = load_digits(return_X_y=True)
    return rm.data.from_numpy((X / 16.0).astype(np.float32), y, valid_fraction=0.2)


def train(**settings: Any):
    data = load_data()
    model = DigitsSGD()
    result = model.train({"num_workers": 2, "num_epochs": 5, **settings}, data=data)
    return model, result, data


def accuracy(model, data) -> float:
    valid = data.splits["valid"]
    return float((np.asarray(model.predict(valid.x)).argmax(1) == valid.y).mean())


install(globals(), [Case("sklearn-sgd", train, accuracy, min_accuracy=0.9)])


def test_the_backend_table_knows_it_without_touching_any_other_file():
    from raymodel import contract
    from raymodel._internal import serialization

    assert contract.model_classes()["RaySGDModel"] is RaySGDModel
    assert "sklearn" in serialization._by_reference_roots()  # pickled by reference, never by value


def test_a_trials_placement_loads_where_this_file_cannot_be_imported(ray_session, tmp_path):
    """Tune pickles a trial's placement function with the trainable; the trial's worker may belong to
    a job whose path lacks this file (the training server started by another process): it must load
    there (CI saw `No module named 'test_sixth_backend'` when it held the backend by reference)."""
    import subprocess
    import sys

    import cloudpickle

    from raymodel.tune import Tunable

    trainable = Tunable(DigitsSGD(), data=load_data(), settings={"num_samples": 1, "progress": False}).as_trainable()
    (tmp_path / "placement.pkl").write_bytes(cloudpickle.dumps(trainable._resources))
    script = (
        "import pickle, sys; f = pickle.load(open(sys.argv[1], 'rb'));"
        "print(f({}).bundles)"  # the trial's config: nothing of its placement tuned
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "placement.pkl")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "[{'CPU': 1.0}]", ran.stdout
