"""PyTorch Lightning on digits: a plain `LightningModule`, trained on 2 Ray workers with DDP.

python examples/lightning_digits.py
"""

from __future__ import annotations

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import raymodel as rm

MIN_ACCURACY = 0.9


class DigitsModule(pl.LightningModule):
    def __init__(self, hidden: int, lr: float):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class LightningDigits(rm.RayLightningModel):
    default_config = {"hidden": 64, "lr": 3e-3}

    def setup(self, config):
        return DigitsModule(config["hidden"], config["lr"])

    def hyperparameter_space(self):
        return {"lr": rm.tune.loguniform(1e-3, 1e-2)}


def load_data():
    X, y = load_digits(return_X_y=True)
    return rm.data.from_numpy((X / 16.0).astype(np.float32), y, valid_fraction=0.2)


def accuracy(model, data) -> float:
    valid = data.splits["valid"]
    return float((np.asarray(model.predict(valid.x)).argmax(1) == valid.y).mean())


def train(**settings):
    data = load_data()
    model = LightningDigits()
    result = model.train({"num_workers": 2, "num_epochs": 6, "batch_size": 32, **settings}, data=data)
    return model, result, data


if __name__ == "__main__":
    rm.init(num_cpus=2)
    model, result, data = train()
    print(f"validation accuracy: {accuracy(model, data):.4f}")
