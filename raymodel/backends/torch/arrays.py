"""Array data as torch tensors: the batches of a worker's rows, read in place from the object store's
arrays (a copy of each batch only), and whole arrays for a ``TensorDataset`` (Lightning)."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch


def to_tensor(a: np.ndarray) -> torch.Tensor:
    """Floats (and booleans) as float32, everything else as int64; always a writable copy
    (arrays from the object store are read-only)."""
    return torch.from_numpy(np.array(a, dtype=_tensor_dtype(a), order="C", copy=True))


def _tensor_dtype(a: np.ndarray) -> type:
    return np.float32 if np.issubdtype(a.dtype, np.floating) or a.dtype == bool else np.int64


def array_batches(x: np.ndarray, y: np.ndarray | None, idx: np.ndarray, batch_size: int) -> Iterable[Any]:
    """Batches of the rows ``idx``, each gathered from the arrays (a new, writable array) and typed as
    ``to_tensor`` types them."""
    for start in range(0, len(idx), batch_size):
        sel = idx[start : start + batch_size]
        yield (_batch_tensor(x, sel),) if y is None else (_batch_tensor(x, sel), _batch_tensor(y, sel))


def _batch_tensor(a: np.ndarray, sel: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.take(a, sel, axis=0).astype(_tensor_dtype(a), copy=False))
