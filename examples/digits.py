"""The quickstart: the digits classifier of DESIGN §1, trained on 2 Ray workers.

Run with `make demo` (or `python examples/digits.py`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import raymodel as rm


class DigitsNet(rm.RayTorchModel):
    default_config = {"hidden": 64, "lr": 1e-3}

    def setup(self, config):
        self.net = nn.Sequential(nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10))

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
        return {"hidden": rm.tune.choice([32, 64, 128]), "lr": rm.tune.loguniform(1e-4, 1e-2)}

    def preprocess(self, payload):
        return torch.tensor(payload["pixels"], dtype=torch.float32)

    def postprocess(self, output):
        return {"digit": output.argmax(-1).tolist()}


def load_data():
    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def main() -> None:
    X, y = load_data()
    data = rm.data.from_numpy(X, y, valid_fraction=0.2)
    rm.init(num_cpus=2)

    print("== train: 2 workers, DDP ==")
    model = DigitsNet(config={"hidden": 128, "lr": 3e-3})
    result = model.train(
        rm.TrainSettings(num_workers=2, num_epochs=12, batch_size=32, metric="val_acc", mode="max"), data=data
    )
    print(f"final validation accuracy: {result.metrics['val_acc']:.4f}")
    print(f"checkpoint: {result.checkpoint}")
    print(
        "local prediction for the first 5 validation rows:",
        model.predict({"pixels": data.splits["valid"].x[:5].tolist()}),
        "true:",
        data.splits["valid"].y[:5].tolist(),
    )


if __name__ == "__main__":
    main()
