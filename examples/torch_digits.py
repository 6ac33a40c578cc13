"""PyTorch on digits: the quickstart's `DigitsNet` with dropout and a learning-rate schedule,
trained with DDP on 2 Ray workers.

    python examples/torch_digits.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsNet, load_data as load_arrays

import raymodel as rm

MIN_ACCURACY = 0.95


class ScheduledDigitsNet(DigitsNet):
    """Dropout, Adam and a learning rate that decays every epoch: the random state, the optimizer's
    moments and the schedule are all in each checkpoint, so a resumed run continues exactly."""

    def setup(self, config):
        self.net = nn.Sequential(
            nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Dropout(0.2), nn.Linear(config["hidden"], 10)
        )

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.net.parameters(), lr=self.config["lr"])
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)


def load_data():
    X, y = load_arrays()
    return rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)


def accuracy(model, data) -> float:
    valid = data.splits["valid"]
    return float((np.asarray(model.predict({"pixels": valid.x.tolist()})["digit"]) == valid.y).mean())


def train(**settings):
    data = load_data()
    model = ScheduledDigitsNet(config={"hidden": 128, "lr": 3e-3})
    result = model.train({"num_workers": 2, "num_epochs": 10, "batch_size": 32, **settings}, data=data)
    return model, result, data


if __name__ == "__main__":
    rm.init(num_cpus=2)
    model, result, data = train()
    print(f"validation accuracy: {accuracy(model, data):.4f}")
