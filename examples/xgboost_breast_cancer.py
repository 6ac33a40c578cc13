"""XGBoost on breast_cancer: distributed boosting on 2 Ray workers, one round per epoch.

python examples/xgboost_breast_cancer.py
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_breast_cancer

import raymodel as rm

MIN_ACCURACY = 0.9


class XGBCancer(rm.RayXGBoostModel):
    default_config = {"max_depth": 3, "eta": 0.3}

    def setup(self, config):
        self.params = {
            "objective": "binary:logistic",
            "eval_metric": ["logloss", "error"],
            "tree_method": "hist",
            "max_depth": config["max_depth"],
            "eta": config["eta"],
        }

    def hyperparameter_space(self):
        return {"eta": rm.tune.uniform(0.05, 0.5)}


def load_data():
    X, y = load_breast_cancer(return_X_y=True)
    return rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)


def accuracy(model, data) -> float:
    valid = data.splits["valid"]
    return float(((np.asarray(model.predict(valid.x)) > 0.5) == valid.y).mean())


def train(**settings):
    data = load_data()
    model = XGBCancer()
    result = model.train({"num_workers": 2, "num_epochs": 10, **settings}, data=data)
    return model, result, data


if __name__ == "__main__":
    rm.init(num_cpus=2)
    model, result, data = train()
    print(f"validation accuracy: {accuracy(model, data):.4f}")
