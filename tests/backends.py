"""One small model per backend, on a scikit-learn data set, for the conformance suite."""

from __future__ import annotations

import numpy as np

import raymodel as rm


def digits_data():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return (X / 16.0).astype(np.float32), y


def iris_data():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    return X.astype(np.float32), y


def cancer_data():
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    return X.astype(np.float32), y


def torch_model():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class TorchDigits(rm.RayTorchModel):
        default_config = {"hidden": 32, "lr": 3e-3}

        def setup(self, config):
            self.net = nn.Sequential(nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10))

        def configure_optimizers(self):
            return torch.optim.Adam(self.net.parameters(), lr=self.config["lr"])

        def train_step(self, batch):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def validation_step(self, batch):
            x, y = batch
            logits = self(x)
            return {"val_loss": F.cross_entropy(logits, y), "val_acc": (logits.argmax(1) == y).float().mean()}

        def hyperparameter_space(self):
            return {"lr": rm.tune.loguniform(1e-3, 1e-2)}

    return TorchDigits


def lightning_model():
    import pytorch_lightning as pl
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

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
        default_config = {"hidden": 32, "lr": 3e-3}

        def setup(self, config):
            return DigitsModule(config["hidden"], config["lr"])

        def hyperparameter_space(self):
            return {"lr": rm.tune.loguniform(1e-3, 1e-2)}

    return LightningDigits


def tensorflow_model():
    class KerasIris(rm.RayTensorflowModel):
        default_config = {"hidden": 16, "lr": 0.02}

        def setup(self, config):
            import tensorflow as tf

            keras = tf.keras
            self.model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(config["hidden"], activation="relu"),
                                           keras.layers.Dense(3)])
            self.model.compile(optimizer=keras.optimizers.Adam(config["lr"]),
                               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                               metrics=["accuracy"])

        def hyperparameter_space(self):
            return {"lr": rm.tune.loguniform(1e-3, 5e-2)}

    return KerasIris


def xgboost_model():
    class XGBCancer(rm.RayXGBoostModel):
        default_config = {"max_depth": 3, "eta": 0.3}

        def setup(self, config):
            self.params = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"],
                           "max_depth": config["max_depth"], "eta": config["eta"], "tree_method": "hist"}

        def hyperparameter_space(self):
            return {"eta": rm.tune.uniform(0.05, 0.5)}

    return XGBCancer


def lightgbm_model():
    class LGBMCancer(rm.RayLightGBMModel):
        default_config = {"num_leaves": 8, "learning_rate": 0.2}

        def setup(self, config):
            self.params = {"objective": "binary", "metric": ["binary_logloss", "binary_error"],
                           "num_leaves": config["num_leaves"], "learning_rate": config["learning_rate"],
                           "min_data_in_leaf": 5}

        def hyperparameter_space(self):
            return {"learning_rate": rm.tune.uniform(0.05, 0.5)}

    return LGBMCancer


#: backend -> (model class factory, data loader, accuracy from (predictions, y))
BACKENDS = {
    "torch": (torch_model, digits_data, lambda out, y: (np.asarray(out).argmax(1) == y).mean()),
    "lightning": (lightning_model, digits_data, lambda out, y: (np.asarray(out).argmax(1) == y).mean()),
    "tensorflow": (tensorflow_model, iris_data, lambda out, y: (np.asarray(out).argmax(1) == y).mean()),
    "xgboost": (xgboost_model, cancer_data, lambda out, y: ((np.asarray(out) > 0.5) == y).mean()),
    "lightgbm": (lightgbm_model, cancer_data, lambda out, y: ((np.asarray(out) > 0.5) == y).mean()),
}
