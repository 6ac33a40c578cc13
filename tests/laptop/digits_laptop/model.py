"""The model class of the off-cluster tests: digits on a small MLP made by this package's ``layers``."""

import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import raymodel as rm
from digits_laptop.layers import mlp


class LaptopDigits(rm.RayTorchModel):
    default_config = {"hidden": 32, "lr": 1e-2}

    def setup(self, config):
        self.net = mlp(config["hidden"])

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=self.config["lr"])

    def forward(self, x):
        return self.net(x)

    def train_step(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch):
        x, y = batch
        logits = self(x)
        return {"val_loss": F.cross_entropy(logits, y), "val_acc": (logits.argmax(1) == y).float().mean()}

    def hyperparameter_space(self):
        return {"lr": rm.tune.loguniform(1e-3, 3e-2)}

    def preprocess(self, payload):
        return torch.tensor(payload["pixels"], dtype=torch.float32)

    def postprocess(self, output):
        return {"digit": output.argmax(-1).tolist()}


class Paced(rm.Callback):
    """Epochs of at least ``seconds``: time to see each row arrive before the run ends. With ``hold`` (a
    location on the cluster's storage), epoch 2 begins once something is written there (at most
    ``hold_s`` later): the follower writes it when it has row 1, so it sees the later rows come."""

    def __init__(self, seconds: float, hold: str | None = None, hold_s: float = 300.0) -> None:
        self.seconds, self.hold, self.hold_s = seconds, hold, hold_s

    def before_epoch(self, epoch):
        if self.hold is not None and epoch == 2:
            from raymodel._internal import storage

            until = time.monotonic() + self.hold_s
            while not storage.exists(self.hold) and time.monotonic() < until:
                time.sleep(0.5)

    def after_epoch(self, epoch, metrics):
        time.sleep(self.seconds)


def data():
    x, y = load_digits(return_X_y=True)
    return rm.data.from_numpy((x / 16.0).astype(np.float32), y.astype(np.int64), valid_fraction=0.2, seed=0)
