"""PyTorch on digits: the quickstart's `DigitsNet`, trained with DDP on 2 Ray workers.

    python examples/torch_digits.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import raymodel as rm  # noqa: E402
from digits import DigitsNet  # noqa: E402
from digits import load_data as load_arrays  # noqa: E402

MIN_ACCURACY = 0.95


def load_data():
    X, y = load_arrays()
    return rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)


def accuracy(model, data) -> float:
    valid = data.splits["valid"]
    return float((np.asarray(model.predict({"pixels": valid.x.tolist()})["digit"]) == valid.y).mean())


def train(**settings):
    data = load_data()
    model = DigitsNet(config={"hidden": 128, "lr": 3e-3})
    result = model.train({"num_workers": 2, "num_epochs": 10, "batch_size": 32, **settings}, data=data)
    return model, result, data


if __name__ == "__main__":
    rm.init(num_cpus=2)
    model, result, data = train()
    print(f"validation accuracy: {accuracy(model, data):.4f}")
