"""What users expect from a trainer: early stopping, precision, gradient accumulation and clipping,
experiment tracking (MLflow, TensorBoard), read back from what each one wrote."""

from __future__ import annotations

import glob
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from models import FailOnce, TinyNet

import raymodel as rm
from raymodel.exceptions import ModelDefinitionError, SettingsError


class LinearNet(rm.RayTorchModel):
    """y = w.x + b under MSE and plain SGD: gradients add up exactly, so accumulation is checkable."""

    default_config = {"lr": 0.1}

    def setup(self, config):
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=self.config["lr"])

    def forward(self, x):
        return self.net(x)

    def train_step(self, batch):
        x, y = batch
        return F.mse_loss(self(x).squeeze(-1), y)


class ManualLinearNet(LinearNet):
    automatic_optimization = False

    def train_step(self, batch):
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.mse_loss(self(x).squeeze(-1), y)
        self.manual_backward(loss)
        opt.step()
        return {"loss": loss}


@pytest.fixture(scope="module")
def linear_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 4)).astype(np.float32)
    y = (X @ np.array([3.0, -2.0, 1.0, 5.0]) + 4.0).astype(np.float32)  # far from the start: big gradients
    return rm.data.from_numpy(X, y, valid_fraction=0)  # 64 training rows: 4 batches of 16, or one of 64


def _start(model_class):
    model = model_class()
    model.ensure_setup()
    return torch.cat([p.detach().reshape(-1) for p in model.net.parameters()])


def _weights(result):
    model = rm.RayModel.from_checkpoint(result.checkpoint)
    return torch.cat([p.detach().reshape(-1) for p in model.net.parameters()])


def _train(model, data, **settings):
    return model.train({"num_workers": 0, "num_epochs": 1, "shuffle": False, "progress": False, **settings}, data=data)


def test_accumulating_4_batches_of_16_is_one_batch_of_64(linear_data):
    start = _start(LinearNet)
    big = _weights(_train(LinearNet(), linear_data, batch_size=64))
    accumulated = _weights(_train(LinearNet(), linear_data, batch_size=16, accumulate_grad_batches=4))
    four_steps = _weights(_train(LinearNet(), linear_data, batch_size=16))
    assert torch.allclose(accumulated, big, atol=1e-5)  # one step on the mean gradient of all 64 rows
    assert not torch.allclose(four_steps, big, atol=1e-3) and not torch.allclose(big, start)


@pytest.mark.parametrize("model_class", [LinearNet, ManualLinearNet])
def test_clipping_bounds_every_update(linear_data, model_class):
    start = _start(model_class)
    free = _weights(_train(model_class(), linear_data, batch_size=64)) - start
    by_norm = _weights(_train(model_class(), linear_data, batch_size=64, grad_clip_norm=0.5)) - start
    by_value = _weights(_train(model_class(), linear_data, batch_size=64, grad_clip_value=0.2)) - start
    lr = LinearNet.default_config["lr"]
    assert free.norm() > 0.5 * lr * 2  # unclipped, the step is far bigger than the clip allows
    assert by_norm.norm() == pytest.approx(0.5 * lr, rel=1e-4)  # one step of lr * (gradient of norm 0.5)
    assert by_value.abs().max() == pytest.approx(0.2 * lr, rel=1e-4) and free.abs().max() > 0.2 * lr * 2


def test_bf16_trains_digits_to_the_same_accuracy_band(digits):
    from models import DigitsNet

    X, y = digits
    data = rm.data.from_numpy(X, y, valid_fraction=0.2)
    runs = {
        p: DigitsNet()
        .train({"num_workers": 0, "num_epochs": 8, "batch_size": 64, "progress": False, "precision": p}, data=data)
        .metrics["val_acc"]
        for p in ("32", "bf16-mixed")
    }
    assert runs["32"] > 0.85 and abs(runs["bf16-mixed"] - runs["32"]) < 0.05, runs


def test_bf16_autocast_really_runs_the_step_in_bfloat16(linear_data):
    class Spy(LinearNet):
        def train_step(self, batch):
            x, y = batch
            out = self(x)
            return {"loss": F.mse_loss(out.float().squeeze(-1), y), "bf16": float(out.dtype == torch.bfloat16)}

    assert _train(Spy(), linear_data, batch_size=64, precision="bf16-mixed").metrics["bf16"] == 1.0
    assert _train(Spy(), linear_data, batch_size=64).metrics["bf16"] == 0.0


def test_step_settings_are_checked_before_anything_runs(tiny):
    with pytest.raises(SettingsError, match="16-mixed.*needs a GPU.*bf16-mixed"):
        rm.TrainSettings(precision="16-mixed")
    with pytest.raises(SettingsError, match="one of `grad_clip_norm` and `grad_clip_value`"):
        rm.TrainSettings(grad_clip_norm=1.0, grad_clip_value=1.0)
    with pytest.raises(SettingsError, match="`precision` must be one of"):
        rm.TrainSettings(precision="fp8")
    with pytest.raises(SettingsError, match="accumulate_grad_batches"):
        rm.TrainSettings(accumulate_grad_batches=0)

    class Trees(rm.RayXGBoostModel):
        def setup(self, config):
            return {"objective": "binary:logistic"}

    X, y = tiny
    with pytest.raises(SettingsError, match="xgboost backend has no gradient steps"):
        Trees().train({"accumulate_grad_batches": 2}, data=rm.data.from_numpy(X, y))


def test_early_stopping_needs_a_patience_of_one_epoch_or_more():
    with pytest.raises(SettingsError, match="patience"):
        rm.callbacks.EarlyStopping(patience=0)


def test_early_stopping_stops_after_patience_epochs_not_min_delta_better():
    stop = rm.callbacks.EarlyStopping("val_loss", patience=2, min_delta=0.05)
    stop.context = rm.RunContext()
    for epoch, value in enumerate([1.0, 0.9, 0.88, 0.87], start=1):  # 0.88 and 0.87: not 0.05 better
        stop.after_epoch(epoch, {"val_loss": value})
    assert stop.context.should_stop and stop.best == 0.9 and stop.stopped_epoch == 4


def test_early_stopping_on_a_metric_the_run_does_not_report_names_it():
    with pytest.raises(ModelDefinitionError, match="watches `val_acc`"):
        rm.callbacks.EarlyStopping("val_acc", mode="max").after_epoch(1, {"val_loss": 1.0})


class PlateauNet(TinyNet):
    """Its val_loss follows a table by epoch: best at epoch 3, never better after."""

    default_config = {**TinyNet.default_config, "plateau": True}
    TABLE = [1.0, 0.8, 0.7, 0.75, 0.74, 0.73, 0.72, 0.71, 0.705, 0.701]

    def validation_step(self, batch):
        epoch = self.context.epoch
        value = self.TABLE[epoch - 1] if self.config["plateau"] else 1.0 / epoch
        return {"val_loss": torch.tensor(value)}


def _events(folder):
    """(tag, step, value) of every scalar in a TensorBoard folder's event files (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        data = Path(path).read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            out += [(v.tag, event.step, v.simple_value) for v in event.summary.value if v.HasField("simple_value")]
    return out


@pytest.mark.integration
def test_early_stopping_and_tracking_survive_a_worker_restart(ray_session, tiny_data, tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    callbacks = [
        rm.callbacks.EarlyStopping("val_loss", patience=3),
        FailOnce(str(tmp_path / "failed"), epoch=5),
        rm.callbacks.MLflowLogger(uri, experiment="plateau"),
        rm.callbacks.TensorBoardLogger(str(tmp_path / "tb")),
    ]
    result = PlateauNet().train(
        {
            "num_workers": 2,
            "num_epochs": 10,
            "max_failures": 1,
            "metric": "val_loss",
            "callbacks": callbacks,
            "progress": False,
            "name": "plateau",
        },
        data=tiny_data,
    )
    # best at 3; 4, 5, 6 no better: stop after 6 (the count came back with the epoch-4 checkpoint after the crash)
    assert (tmp_path / "failed").exists() and [r["epoch"] for r in result.history] == [1, 2, 3, 4, 5, 6]
    assert result.checkpoint.endswith("checkpoint_epoch_000006") and result.best_checkpoint.endswith("000003")

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["plateau"])
    assert len(runs) == 1, "the restarted worker group must continue the same MLflow run"
    run = runs.iloc[0]
    assert run["params.config.plateau"] == "True" and run["params.settings.num_epochs"] == "10"
    history = mlflow.MlflowClient(uri).get_metric_history(run["run_id"], "val_loss")
    assert sorted({(m.step, round(m.value, 4)) for m in history}) == [
        (e, v) for e, v in enumerate(PlateauNet.TABLE[:6], start=1)
    ]
    artifacts = [a.path for a in mlflow.MlflowClient(uri).list_artifacts(run["run_id"], "checkpoint")]
    assert "checkpoint/raymodel.json" in artifacts, artifacts  # the final checkpoint, whole

    scalars = _events(str(tmp_path / "tb" / "plateau"))
    assert sorted({step for tag, step, _ in scalars if tag == "val_loss"}) == [1, 2, 3, 4, 5, 6]

    figure = result.plot(str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    assert set(lines) == {"loss", "val_loss"} and list(lines["val_loss"].get_ydata()) == pytest.approx(
        PlateauNet.TABLE[:6]
    )


@pytest.mark.integration
def test_early_stopping_in_a_tune_trial_ends_that_trial_only(ray_session, tiny_data, tmp_path):
    result = PlateauNet().tune(
        {"plateau": rm.tune.grid_search([True, False])},
        data=tiny_data,
        settings={
            "num_samples": 1,
            "max_epochs": 10,
            "scheduler": "fifo",
            "progress": False,
            "train": {"callbacks": [rm.callbacks.EarlyStopping("val_loss", patience=3)], "progress": False},
        },
    )
    by_plateau = {t["config/plateau"]: t for t in result.trials}
    assert {k: t["epochs"] for k, t in by_plateau.items()} == {True: 6, False: 10}
    assert by_plateau[True]["stopped_early"] and not by_plateau[False]["stopped_early"]

    figure = result.plot(str(tmp_path / "trials.png"))
    assert (tmp_path / "trials.png").stat().st_size > 5_000
    curves = [line for line in figure.axes[0].get_lines() if line.get_marker() != "x"]
    crosses = [line for line in figure.axes[0].get_lines() if line.get_marker() == "x"]
    assert sorted(len(line.get_xdata()) for line in curves) == [6, 10]  # every epoch of every trial
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [6]  # the early-stopped trial's end
    best = by_plateau[False]["trial_id"]  # 1/epoch: 0.1 beats the plateau's 0.73
    assert result.best_trial_id == best and [
        line.get_linewidth() for line in curves if line.get_label().startswith(best)
    ] == [3]


def _lightning_linear():
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(4, 1)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self(x).squeeze(-1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class LinearLightning(rm.RayLightningModel):
        def setup(self, config):
            return Module()

    return LinearLightning


def test_lightning_gets_the_same_step_settings(linear_data):
    model_class = _lightning_linear()

    def weights(**settings):
        model = model_class()
        result = _train(model, linear_data, **settings)
        return torch.cat(
            [p.detach().reshape(-1) for p in rm.RayModel.from_checkpoint(result.checkpoint).module.parameters()]
        )

    model = model_class()
    model.ensure_setup()
    start = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    big = weights(batch_size=64)
    assert torch.allclose(weights(batch_size=16, accumulate_grad_batches=4), big, atol=1e-5)
    assert (weights(batch_size=64, grad_clip_norm=0.5) - start).norm() == pytest.approx(0.05, rel=1e-4)
    assert not torch.allclose(weights(batch_size=64, precision="bf16-mixed"), start)
