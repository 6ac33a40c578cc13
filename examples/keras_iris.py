"""Keras on iris: a `tf.keras` model trained with MultiWorkerMirroredStrategy on 2 Ray workers.

python examples/keras_iris.py
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_iris

import raymodel as rm

MIN_ACCURACY = 0.85


class KerasIris(rm.RayTensorflowModel):
    default_config = {"hidden": 16, "lr": 0.03}

    def setup(self, config):
        import tensorflow as tf

        keras = tf.keras  # Keras 2 (tf-keras): Keras 3 lacks MultiWorkerMirroredStrategy support
        self.model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(config["hidden"], activation="relu"), keras.layers.Dense(3)]
        )
        self.model.compile(
            optimizer=keras.optimizers.Adam(config["lr"]),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    def hyperparameter_space(self):
        return {"lr": rm.tune.loguniform(1e-3, 5e-2)}


def load_data():
    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    return rm.data.from_numpy(X.astype(np.float32), y, valid_fraction=0.2)


def accuracy(model, data) -> float:
    valid = data.splits["valid"]
    return float((np.asarray(model.predict(valid.x)).argmax(1) == valid.y).mean())


def train(**settings):
    data = load_data()
    model = KerasIris()
    result = model.train({"num_workers": 2, "num_epochs": 8, "batch_size": 8, **settings}, data=data)
    return model, result, data


if __name__ == "__main__":
    rm.init(num_cpus=2)
    model, result, data = train()
    print(f"validation accuracy: {accuracy(model, data):.4f}")
