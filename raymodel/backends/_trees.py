"""What the boosted-tree backends share: arrays per worker shard, one boosting round per epoch.

Hooks a tree backend calls, per worker: every hook but ``before_batch`` and
``after_batch`` (there are no batches). Each epoch boosts one round (the
framework's low-level ``update``), evaluates the training rows, then the
validation rows; metrics are averaged over workers weighted by their rows,
so every validation row counts exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from raymodel.contract import Backend, Inference, WorkerLoop, rows_of
from raymodel.data import worker_rows
from raymodel.exceptions import DataError, ModelDefinitionError


def trained_booster(model: Any) -> Any:
    """The model's booster; a ``ModelDefinitionError`` for a model not trained yet."""
    if model.booster is None:
        raise ModelDefinitionError(f"`{type(model).__name__}` has no trained booster yet: train it first.")
    return model.booster


class TreeInference(Inference[Any]):
    """A booster's answers: rows in (one row as a batch of one), its predictions out; a subclass says how
    its framework predicts (``forward``)."""

    def preprocess(self, model: Any, payload: Any) -> Any:
        x = rows_of(payload)
        return x.reshape(1, -1) if x.ndim == 1 else x


class TreeBackend(Backend):
    """What XGBoost and LightGBM share: ``self.params`` in, ``self.booster`` out.

    A subclass says how the framework loads a booster (``load_booster``;
    saving is ``booster.save_model`` in both) and how it predicts.
    """

    epoch_unit = "round"
    accepts = ("arrays",)
    required_methods = ("setup",)
    hook_notes = {"before_batch": "no (no batches)", "after_batch": "no (no batches)"}
    state_keys = ("booster",)
    #: The booster's file in the checkpoint's ``state/`` folder.
    booster_file = ""

    def load_booster(self, path: Path) -> Any:
        raise NotImplementedError("The 'load_booster' method must be implemented.")

    def after_user_setup(self, model: Any, returned: Any) -> None:
        if not isinstance(getattr(model, "params", None), dict):
            raise ModelDefinitionError(
                f"`{type(model).__name__}.setup` must set `self.params`, the booster's "
                "parameter dict (e.g. `{'objective': 'binary'}`)."
            )
        if not hasattr(model, "booster"):
            model.booster = None

    def get_state(self, model: Any) -> dict[str, Any]:
        return {"booster": model.booster}

    def write_state(self, model: Any, state: dict[str, Any], directory: Path) -> None:
        if state.get("booster") is not None:
            state["booster"].save_model(str(directory / self.booster_file))  # the framework's own format

    def read_state(self, model: Any, directory: Path) -> dict[str, Any]:
        path = directory / self.booster_file
        return {"booster": self.load_booster(path) if path.exists() else None}

    def set_state(self, model: Any, state: dict[str, Any]) -> None:
        model.booster = state.get("booster")

    def num_features(self, booster: Any) -> int:
        """How many features a row of ``booster``'s input has."""
        raise NotImplementedError("The 'num_features' method must be implemented.")

    def unrecorded_signature(self, model: Any) -> dict[str, Any] | None:
        """The booster's width; NaN is a missing value to a boosted tree, so it is allowed."""
        booster = getattr(model, "booster", None)
        width = {"shape": [self.num_features(booster)]} if booster is not None else {}
        return {**width, "nonfinite": "allow"}

    def check_split(self, name: str, split: Any) -> None:
        if not hasattr(split.x, "ndim"):
            return  # object-store refs: a tune trial re-checks data the driver already checked
        if split.y is None or split.x.ndim != 2:
            raise DataError(
                f"The {self.name} backend needs 2-D features and labels "
                f"(split {name!r} has X of shape {getattr(split.x, 'shape', '?')} "
                f"and {'no' if split.y is None else 'some'} labels)."
            )


class TreeLoop(WorkerLoop):
    """One boosting round per epoch; a subclass wraps its framework's booster API."""

    #: The user's model: its networks, optimizers or booster are attributes that its ``setup`` and this loop set.
    model: Any

    def build(self) -> None:
        self.rows = {name: self._shard(name) for name in self.run.splits}
        self.datasets: dict[str, Any] = {}
        for name in sorted(self.rows, key=lambda n: n != "train"):  # train first: others may refer to it
            self.datasets[name] = self.dataset(name, *self.rows[name])

    def _shard(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        split, run, s = self.run.splits[name], self.run, self.run.settings
        idx = worker_rows(len(split), run.rank, run.world, train=name == "train", shuffle=s.shuffle, seed=s.seed)
        return np.asarray(split.x)[idx], np.asarray(split.y)[idx]

    def apply_config(self, changes: dict[str, Any]) -> None:
        """Config keys that are also keys of ``self.params`` change the booster's parameters (from the
        next round on); the others are only in ``self.config``."""
        params = {k: v for k, v in changes.items() if k in self.model.params}
        if params:
            self.model.params.update(params)
            self.set_params(params)

    def set_params(self, params: dict[str, Any]) -> None:
        """Change the booster's parameters between rounds."""
        raise NotImplementedError("The 'set_params' method must be implemented.")

    async def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.booster = self.boost(epoch)
        return self._mean("train", epoch)

    async def validate(self, epoch: int) -> dict[str, float]:
        return self._mean("valid", epoch)

    def _mean(self, name: str, epoch: int) -> dict[str, float]:
        """The split's metrics over every worker's rows (the first metric is ``loss``)."""
        n = len(self.rows[name][0])
        metrics = {
            ("loss" if i == 0 else metric): value for i, (metric, value) in enumerate(self.evaluate(name, epoch))
        }
        return self.run.mean_over_workers({k: (v * n, n) for k, v in metrics.items()})

    # -------------------------------------------------- the framework's part
    def dataset(self, name: str, x: np.ndarray, y: np.ndarray) -> Any:
        """The framework's data structure for one split of this worker's rows."""
        raise NotImplementedError("The 'dataset' method must be implemented.")

    def boost(self, epoch: int) -> Any:
        """Add one boosting round (continuing ``self.model.booster`` if restored); return the booster."""
        raise NotImplementedError("The 'boost' method must be implemented.")

    def evaluate(self, name: str, epoch: int) -> list[tuple[str, float]]:
        """``[(metric name, value), ...]`` of the booster on this worker's rows of split ``name``."""
        raise NotImplementedError("The 'evaluate' method must be implemented.")
