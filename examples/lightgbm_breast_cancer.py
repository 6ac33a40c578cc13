"""LightGBM on breast_cancer: data-parallel boosting on 2 Ray workers, one round per epoch.

python examples/lightgbm_breast_cancer.py
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_breast_cancer

import raymodel as rm

MIN_ACCURACY = 0.9


class LGBMCancer(rm.RayLightGBMModel):
    default_config = {"num_leaves": 8, "learning_rate": 0.2}

    def setup(self, config):
        self.params = {
            "objective": "binary",
            "metric": ["binary_logloss", "binary_error"],
            "min_data_in_leaf": 5,
            "num_leaves": config["num_leaves"],
            "learning_rate": config["learning_rate"],
        }

    def hyperparameter_space(self):
        return {"learning_rate": rm.tune.uniform(0.05, 0.5)}


def load_data():
    X, y = load_breast_cancer(return_X_y=True)
    return rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)


def accuracy(model, data) -> float:
    valid = data.splits["valid"]
    return float(((np.asarray(model.predict(valid.x)) > 0.5) == valid.y).mean())


def train(**settings):
    data = load_data()
    model = LGBMCancer()
    result = model.train({"num_workers": 2, "num_epochs": 10, **settings}, data=data)
    return model, result, data


if __name__ == "__main__":
    rm.init(num_cpus=2)
    model, result, data = train()
    print(f"validation accuracy: {accuracy(model, data):.4f}")
