"""Data for ``train`` and ``tune``: build it once, hand it to any verb.

Example:
    >>> from sklearn.datasets import load_digits
    >>> X, y = load_digits(return_X_y=True)
    >>> data = rm.data.from_numpy(X / 16.0, y, valid_fraction=0.2)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from raymodel._internal.settings import check_seed
from raymodel.data._loading import aprefetch, aworker_batches, prefetch, shard_indices, worker_batches, worker_rows
from raymodel.data._splits import (
    Arrays,
    Batches,
    DataSpec,
    InStore,
    RayDataset,
    TorchDataset,
    in_object_store,
    is_ray_dataset,
    kind_of,
    make_arrays,
    nonfinite,
    resolve,
)
from raymodel.exceptions import DataError

__all__ = [
    "from_numpy",
    "from_pandas",
    "DataSpec",
    "Arrays",
    "TorchDataset",
    "Batches",
    "RayDataset",
    "InStore",
    "in_object_store",
    "resolve",
    "kind_of",
    "is_ray_dataset",
    "prefetch",
    "aprefetch",
    "shard_indices",
    "worker_rows",
    "worker_batches",
    "aworker_batches",
    "nonfinite",
]


def from_numpy(X: Any, y: Any = None, valid_fraction: float = 0.2, seed: int = 0) -> DataSpec:
    """Split arrays into train and validation sets (a seeded shuffle).

    Args:
        X: Features, first dimension = rows.
        y: Labels with one entry per row, or ``None`` for unsupervised data
            (batches are then ``(x,)``).
        valid_fraction: Share of rows held out for validation, in ``[0, 1)``;
            ``0`` means no validation split.
        seed: Seed of the shuffle that picks the validation rows.

    Returns:
        A ``DataSpec`` with ``train`` (and ``valid``) splits.
    """
    if not isinstance(valid_fraction, (int, float)) or isinstance(valid_fraction, bool) or not 0 <= valid_fraction < 1:
        raise DataError(f"`valid_fraction` must be a number in [0, 1) (got {valid_fraction!r}).")
    check_seed("seed", seed, DataError)
    arrays = make_arrays(X, y, "`from_numpy`")
    n = len(arrays)
    n_valid = int(round(n * valid_fraction))
    if valid_fraction > 0 and (n_valid == 0 or n_valid == n):
        raise DataError(
            f"`valid_fraction={valid_fraction}` of {n} rows leaves an empty split; use more rows or `valid_fraction=0`."
        )
    order = np.random.default_rng(seed).permutation(n)
    valid_idx, train_idx = np.sort(order[:n_valid]), np.sort(order[n_valid:])
    splits = {"train": _take(arrays, train_idx)}
    if n_valid:
        splits["valid"] = _take(arrays, valid_idx)
    return DataSpec(splits)


def from_pandas(
    df: Any, label: str | None = None, valid_fraction: float = 0.2, seed: int = 0, features: Sequence[str] | None = None
) -> DataSpec:
    """Like ``from_numpy``, from a DataFrame: ``label`` is the target column.

    Args:
        df: A pandas DataFrame with numeric columns.
        label: Name of the label column, or ``None`` for unsupervised data.
        features: Columns to use as features (default: every other column).
    """
    if not hasattr(df, "columns"):
        raise DataError(f"`from_pandas` needs a pandas DataFrame (got {type(df).__name__}).")
    columns = list(df.columns)
    if label is not None and label not in columns:
        raise DataError(f"`label={label!r}` is not a column of the DataFrame; columns are {columns}.")
    check_seed("seed", seed, DataError)
    feature_cols = list(features) if features is not None else [c for c in columns if c != label]
    if label is not None and label in feature_cols:
        raise DataError(
            f"`label={label!r}` is also listed in `features`: the model would see its target as an input "
            "(a leak). Leave it out of `features`."
        )
    missing = [c for c in feature_cols if c not in columns]
    if missing:
        raise DataError(f"`features` names columns the DataFrame lacks: {missing}; columns are {columns}.")
    arrays = make_arrays(
        df[feature_cols].to_numpy(), None if label is None else df[label].to_numpy(), "`from_pandas`"
    )  # checked before any cast: no complex or wrapped values
    return from_numpy(arrays.x.astype(np.float32), arrays.y, valid_fraction=valid_fraction, seed=seed)


def _take(arrays: Arrays, idx: np.ndarray) -> Arrays:
    return Arrays(arrays.x[idx], None if arrays.y is None else arrays.y[idx])
