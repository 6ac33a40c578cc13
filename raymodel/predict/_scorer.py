"""The Ray Data actor of ``predict_batch``: one loaded model, many batches."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from raymodel._internal import signature
from raymodel._ray import cluster
from raymodel.contract.schema import schemas_of
from raymodel.exceptions import DataError, ModelDefinitionError
from raymodel.registry import sources


class Scorer:
    """Loads the model once (in ``__init__``, from its source) and scores each batch it is handed.

    Only the small ``source`` dict travels to the actor; the weights are read from
    the checkpoint or registry there, never pickled per batch.
    """

    def __init__(
        self, source: dict[str, Any], feature_columns: list[str] | None, keep_columns: list[str], cpus: float = 1
    ) -> None:
        self.model = sources.load(source, source.get("version"))
        self.feature_columns, self.keep_columns = feature_columns, keep_columns
        cluster.set_threads(cpus)
        self.warned = False

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        model = self.model
        if self.feature_columns is not None:
            features = {name: batch[name] for name in self.feature_columns}
        else:
            features = {name: values for name, values in batch.items() if name not in self.keep_columns}
        x = model.predict_batch_preprocess(features)
        if schemas_of(type(model)).input is None:  # a declared schema wins
            try:
                signature.check(signature.of_model(model), x, warn=self._warn)
            except DataError as exc:
                where = f"`predict_batch` of `{type(model).__name__}` (columns {list(features)})"
                raise DataError(f"{where}: {exc}.") from None
        with model.backend.inference.mode(model):
            output = model.forward(x)
        columns = model.predict_batch_postprocess(output)
        rows = len(next(iter(batch.values())))
        _check_columns(type(model).__name__, columns, rows)
        for name in self.keep_columns:
            columns[name] = batch[name]
        return columns

    def _warn(self, message: str) -> None:
        if not self.warned:  # once per actor, not once per batch
            self.warned = True
            logging.getLogger("ray.data").warning("predict_batch: %s (scored anyway).", message)


def _check_columns(name: str, columns: Any, rows: int) -> None:
    if not isinstance(columns, dict) or not columns:
        raise ModelDefinitionError(
            f"`{name}.predict_batch_postprocess` must return a dict of output columns "
            f"{{name: array}} (got a {type(columns).__name__})."
        )
    for column, values in columns.items():
        if len(values) != rows:
            raise ModelDefinitionError(
                f"`{name}.predict_batch_postprocess` returned column {column!r} with {len(values)} entries for a "
                f"batch of {rows} rows; every column needs one entry per input row."
            )
