"""A model's input signature: the shape (beyond the batch dimension) and dtype of what it was trained on.

Like MLflow's inferred model signature, it is recorded at training (in every
checkpoint's manifest, as ``input_signature``) and checked wherever the model
predicts (``predict``, a served route, ``predict_batch``) on what ``preprocess``
made of a request, before ``forward``: a request of another shape is the
client's error (a ``DataError``, over HTTP a 422), not the model's. NaN, None
(NaN once cast) and infinity in an input follow the ``nonfinite`` policy the
model was trained with; complex values are refused, as in training. A declared
``input_schema`` wins: a model with one is not checked against its signature.

The signature is known for array data (``(X, y)``, ``rm.data.from_numpy``/
``from_pandas``, a torch ``Dataset`` of ``(x, y)`` items, a list of ``(x, y)``
batches); a ``ray.data`` Dataset, a data module or dict batches record none, and
a model without one is not checked.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import numpy as np

from raymodel.exceptions import DataError

#: Numpy dtype kinds of a numeric input (bool, ints, floats).
_NUMERIC = "biuf"


def of_array(x: Any, rows: bool = True) -> dict[str, Any] | None:
    """``{"shape": [...], "dtype": "float32"}`` of an array or tensor of rows (``rows=False``: of one
    item, which has no batch dimension); ``None`` for anything else."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None or type(x).__name__ == "ObjectRef":
        return None
    shape = [int(n) for n in tuple(shape)]
    if rows and not shape:
        return None
    return {"shape": shape[1:] if rows else shape, "dtype": dtype_name(dtype)}


def dtype_name(dtype: Any) -> str:
    """``float32`` for a numpy or a torch dtype."""
    return str(dtype).removeprefix("torch.")


def describe_shape(shape: list[int | None]) -> str:
    """``rows of 64 values`` for a 1-D signature, ``inputs of shape (N, 8, 8)`` otherwise (``?``: any)."""
    if len(shape) == 1 and shape[0] is not None:
        return f"rows of {shape[0]} value{'s' if shape[0] != 1 else ''}"
    if not shape:
        return "single values (shape (N,))"
    return f"inputs of shape (N, {', '.join('?' if n is None else str(n) for n in shape)})"


def of_model(model: Any) -> dict[str, Any] | None:
    """The signature ``model``'s inputs are checked against: the one its training recorded, else what
    its backend can tell of the model itself (``Backend.unrecorded_signature``); ``None`` for anything
    that is not a model instance (a registry reference, a checkpoint's path)."""
    recorded: dict[str, Any] | None = getattr(model, "input_signature", None)
    if recorded:
        return recorded
    backend = getattr(model, "backend", None)
    return None if backend is None else backend.unrecorded_signature(model)


def check(
    signature: dict[str, Any] | None,
    x: Any,
    warn: Callable[[str], None] | None = None,
) -> None:
    """Raise ``DataError`` when ``x`` (what ``preprocess`` made of a request) does not fit ``signature``.

    ``warn`` receives the message about non-finite values under the ``"warn"`` policy
    (default: a ``RuntimeWarning``).
    """
    if not signature or getattr(x, "shape", None) is None or getattr(x, "dtype", None) is None:
        return
    if "shape" in signature:  # a length of None: any (a Keras input of any sequence length)
        expected = [None if n is None else int(n) for n in signature["shape"]]
        got = [int(n) for n in tuple(x.shape)]
        if not _fits(got[1:], expected) and not _fits(got, expected):  # rows, or one row without its batch
            raise DataError(f"expected {describe_shape(expected)}, got {_got(got, expected)}")
    kind = _kind(str(x.dtype))
    if kind == "c":
        raise DataError(
            "the input holds complex values; the model takes real numbers (pass the real and imaginary "
            "parts as separate features)"
        )
    if kind not in _NUMERIC:
        raise DataError(f"expected numbers ({signature.get('dtype', 'numeric')}), got {dtype_name(x.dtype)} values")
    policy = signature.get("nonfinite", "warn")
    if kind != "f" or policy == "allow":
        return
    bad, size = _nonfinite(x)
    if not bad:
        return
    why = signature.get("why") or f"the model was trained with `nonfinite={policy!r}`"
    message = f"the input holds {bad} NaN, None or infinite value(s) of {size}; {why}"
    if policy == "error":
        raise DataError(message)
    (warn or _warn)(message)


def check_payload(payload: Any) -> None:
    """A payload that is already an array or tensor of complex values is refused before ``preprocess``
    casts it (a cast to float would drop the imaginary part silently)."""
    dtype = getattr(payload, "dtype", None)
    if dtype is not None and _kind(str(dtype)) == "c":
        raise DataError(
            f"the input is complex ({dtype_name(dtype)}); the model takes real numbers (pass the real "
            "and imaginary parts as separate features)"
        )


def _fits(got: list[int], expected: list[int | None]) -> bool:
    return len(got) == len(expected) and all(e is None or g == e for g, e in zip(got, expected))


def _got(got: list[int], expected: list[int | None]) -> str:
    if len(expected) == 1 and len(got) == 2:
        return f"{got[1]}"
    if len(expected) == 1 and len(got) == 1:
        return f"a single row of {got[0]}"
    return f"shape {tuple(got)}"


@functools.lru_cache(maxsize=64)
def _kind(dtype: str) -> str:
    """numpy's kind letter (``f``, ``i``, ``c``, ``U``, ...) of a numpy or torch dtype's name."""
    name = dtype_name(dtype)
    try:
        return np.dtype(name).kind
    except TypeError:  # torch's own dtypes
        return {"bfloat16": "f", "complex32": "c"}.get(name, "O")


def _nonfinite(x: Any) -> tuple[int, int]:
    """How many values of ``x`` are NaN or infinite, of how many; a tensor is counted where it lives
    (no copy off its device). A finite sum means every value is finite (one NaN or infinity makes the
    sum NaN or infinite): one pass without a mask in the common case; a sum that overflows is counted."""
    if hasattr(x, "isfinite") and hasattr(x, "numel"):  # a torch tensor
        if bool(x.sum().isfinite()):
            return 0, int(x.numel())
        return int((~x.isfinite()).sum()), int(x.numel())
    values = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(values.sum()):
            return 0, int(values.size)
    return int(values.size - np.count_nonzero(np.isfinite(values))), int(values.size)


def _warn(message: str) -> None:
    warnings.warn(message[:1].upper() + message[1:] + ".", RuntimeWarning, stacklevel=4)
