"""`model.train()` end to end on Ray Train V2 workers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conformance import attempts, recorded
from models import DigitsNet, FailOnce, ManualNet, Recorder, TinyNet, WeightsReporter

import raymodel as rm
from raymodel.exceptions import TrainingError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained_digits(ray_session, digits):
    X, y = digits
    data = rm.data.from_numpy(X, y, valid_fraction=0.2)
    model = DigitsNet(config={"hidden": 128})
    settings = rm.TrainSettings(
        num_workers=2, num_epochs=10, batch_size=32, metric="val_acc", mode="max", keep_checkpoints=3
    )
    return model, model.train(settings, data=data), data


def test_digits_reach_high_accuracy_on_two_workers(trained_digits):
    model, result, data = trained_digits
    assert result.metrics["val_acc"] >= 0.95
    assert [row["epoch"] for row in result.history] == list(range(1, 11))
    assert all({"epoch", "loss", "val_loss", "val_acc"} <= set(row) for row in result.history)
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    # The instance holds the trained weights: local predictions match the reported accuracy.
    valid = data.splits["valid"]
    predicted = np.array(model.predict({"pixels": valid.x.tolist()})["digit"])
    assert (predicted == valid.y).mean() == pytest.approx(result.metrics["val_acc"], abs=1e-6)


def test_best_checkpoint_follows_the_metric_and_old_ones_are_pruned(trained_digits):
    _, result, _ = trained_digits
    best_epoch = max(result.history, key=lambda r: r["val_acc"])["epoch"]
    manifest = json.loads(open(f"{result.best_checkpoint}/raymodel.json").read())
    assert result.history[manifest["epoch"] - 1]["val_acc"] == result.history[best_epoch - 1]["val_acc"]
    import glob

    kept = sorted(glob.glob(f"{result.path}/checkpoint_epoch_*/raymodel.json"))
    assert 3 <= len(kept) <= 3 + 1  # the best 3 (+ the latest)
    assert result.checkpoint.endswith("checkpoint_epoch_000010")


def test_checkpoint_restores_identical_predictions_in_a_fresh_process(trained_digits, digits):
    model, result, _ = trained_digits
    X, _ = digits
    rows = X[:20].tolist()
    code = textwrap.dedent("""
        import json, sys
        import raymodel as rm
        model = rm.RayModel.from_checkpoint(sys.argv[1])
        print(json.dumps(model.predict({"pixels": json.loads(sys.stdin.read())})))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code, result.checkpoint],
        input=json.dumps(rows),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == model.predict({"pixels": rows})


def test_manual_optimization_keeps_workers_in_step(ray_session, tmp_path, tiny):
    X, y = tiny
    result = ManualNet().train(
        rm.TrainSettings(num_workers=2, num_epochs=6, batch_size=2, callbacks=[WeightsReporter(str(tmp_path))]),
        data=rm.data.from_numpy(X, y, valid_fraction=0.25),
    )
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    w0, w1 = (float((tmp_path / f"weights{r}.txt").read_text()) for r in (0, 1))
    assert w0 == pytest.approx(w1, rel=1e-6), "gradients were not averaged across workers"


def test_a_worker_that_raises_resumes_from_its_last_checkpoint(ray_session, tmp_path, tiny):
    X, y = tiny
    settings = rm.TrainSettings(
        num_workers=2,
        num_epochs=3,
        max_failures=1,
        progress=False,
        callbacks=[FailOnce(str(tmp_path / "crashed"), epoch=2), Recorder(str(tmp_path))],
    )
    result = TinyNet().train(settings, data=rm.data.from_numpy(X, y))
    assert (tmp_path / "crashed").exists()
    assert [row["epoch"] for row in result.history] == [1, 2, 3]
    # The second attempt loaded epoch 1's checkpoint and began at epoch 2: no epoch trained twice.
    second = attempts(recorded(tmp_path, 0))[1]
    assert second[:5] == ["before_setup", "after_setup", "on_load_checkpoint", "before_fit", "before_epoch(2)"]


def test_a_failure_in_a_step_names_it(ray_session, tiny):
    class Broken(TinyNet):
        def train_step(self, batch):
            raise ValueError("bad batch shape")

    X, y = tiny
    with pytest.raises(TrainingError, match="train_step.*ValueError: bad batch shape"):
        Broken().train({"num_workers": 0}, data=rm.data.from_numpy(X, y))
