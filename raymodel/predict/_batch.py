"""``predict_batch``: a data set scored by a pool of Ray Data actors, each holding one loaded model."""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np

from raymodel._internal import locations, signature, storage, tmp
from raymodel._ray import cluster
from raymodel.contract import training_server
from raymodel.exceptions import CheckpointError, DataError, SettingsError
from raymodel.registry import sources

if TYPE_CHECKING:
    from raymodel.contract import Model

from ray.data import Dataset as _Dataset

#: Rows per batch handed to ``forward`` when ``batch_size`` is not given.
DEFAULT_BATCH_SIZE = 1024
_READERS = {".parquet": "read_parquet", ".csv": "read_csv"}


class Predictions(_Dataset):
    """The result of ``predict_batch``: a lazy ``ray.data.Dataset`` of output columns.

    Rows come out in the input's order. Nothing runs until it is read
    (``iter_batches``, ``take``, ``to_pandas``, ``to_numpy``) or written
    (``write_parquet``). Every ``ray.data.Dataset`` method works on it.
    """

    def to_numpy(self, column: str | None = None) -> Any:
        """A small result as numpy: ``{column: array}``, or one column's array when ``column`` is given.

        Gathers every row on the driver; for large results, iterate or ``write_parquet``.
        """
        parts: dict[str, list[np.ndarray]] = {}
        for batch in self.iter_batches(batch_size=None, batch_format="numpy"):
            for name, values in batch.items():
                parts.setdefault(name, []).append(values)
        arrays = {name: np.concatenate(values) for name, values in parts.items()}
        if column is None:
            return arrays
        if column not in arrays:
            raise KeyError(f"No column {column!r} in the predictions; they have {sorted(arrays)}.")
        return arrays[column]


def predict_batch(
    model_or_ref: Any,
    data: Any,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    concurrency: int | tuple[int, int] | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    feature_columns: Sequence[str] | None = None,
    keep_columns: Sequence[str] = (),
    preserve_order: bool = True,
    registry: str | None = None,
) -> Predictions:
    """Score ``data`` with a model, on a pool of Ray Data actors; each loads the model once.

    Each actor runs ``predict_batch_preprocess(batch) -> forward ->
    predict_batch_postprocess(output)`` on batches of ``batch_size`` rows, in
    the backend's inference mode (eval, no gradients).

    Args:
        model_or_ref: A model instance (its current weights), a registry
            reference (``"digits@production"``, ``"digits:3"``, ``"digits"``; an
            alias is resolved once, now, so every row gets the same version),
            a ``ModelRef``, or a checkpoint's path or URI.
        data: A ``ray.data.Dataset``, a numpy array of rows (one column
            ``"data"``), a pandas DataFrame, or the path/URI of a Parquet or CSV
            file or of a folder of them.
        batch_size: Rows per ``forward`` call.
        concurrency: Actors in the pool: a number, or ``(min, max)`` to
            autoscale. Default: from 1 up to as many as the cluster's free
            resources hold.
        num_cpus: CPUs each actor reserves (torch uses as many threads).
        num_gpus: GPUs each actor reserves (putting the model and each batch on
            the GPU is the model's part, e.g. in ``after_setup`` and
            ``predict_batch_preprocess``).
        feature_columns: The columns fed to the model (default: every column
            not in ``keep_columns``).
        keep_columns: Input columns copied into the output beside the
            predictions (an id, say).
        preserve_order: Rows come out in the input's order (default). ``False``
            lets each block out as soon as it is scored: for outputs whose order
            does not matter (with an id in ``keep_columns``, say).
        registry: The registry of a reference (default ``RAYMODEL_REGISTRY`` or
            ``$RAYMODEL_HOME/registry``).

    Returns:
        ``Predictions``, a ``ray.data.Dataset`` whose rows follow the input's.

    Raises:
        SettingsError: a bad option; DataError: data in no form it reads;
        RegistryError/CheckpointError: no such model. All before any actor starts.

    Example:
        >>> preds = rm.predict_batch("digits@production", "s3://bucket/features/", batch_size=4096)
        >>> preds.write_parquet("s3://bucket/scores/")
    """
    _check_options(batch_size, concurrency, num_cpus, num_gpus, feature_columns, keep_columns)
    reader = _reader_of(data)  # bad data fails here, before Ray or the model is touched
    source = _source_of(model_or_ref, registry)
    cluster.ensure_ray(False)
    training_server().make_room()  # idle pools of the training server give their resources back first
    import ray.data

    from raymodel.predict._scorer import Scorer

    dataset = reader()
    if feature_columns or keep_columns:
        _check_columns(dataset, [*(feature_columns or ()), *keep_columns])
    _check_signature(model_or_ref, dataset, feature_columns, keep_columns)
    compute = (
        ray.data.ActorPoolStrategy(min_size=1, max_size=None)
        if concurrency is None
        else ray.data.ActorPoolStrategy(size=concurrency)
        if isinstance(concurrency, int)
        else ray.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
    )
    scored = dataset.map_batches(
        Scorer,
        batch_size=batch_size,
        batch_format="numpy",
        compute=compute,
        num_cpus=num_cpus,
        num_gpus=num_gpus or None,
        zero_copy_batch=True,
        fn_constructor_kwargs={
            "source": source,
            "feature_columns": list(feature_columns or ()) or None,
            "keep_columns": list(keep_columns),
            "cpus": num_cpus,
        },
    )
    result = cast(Predictions, _Dataset.copy(scored, _deep_copy=True, _as=Predictions))  # its own context: ...
    result.context.execution_options.preserve_order = bool(preserve_order)  # ... not the caller's global one
    return result


def _check_options(
    batch_size: Any, concurrency: Any, num_cpus: Any, num_gpus: Any, feature_columns: Any, keep_columns: Any
) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SettingsError(f"`batch_size` must be a whole number of rows >= 1 (got {batch_size!r}).")
    ok_pool = (
        concurrency is None
        or (isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1)
        or (
            isinstance(concurrency, tuple)
            and len(concurrency) == 2
            and all(isinstance(c, int) and c >= 1 for c in concurrency)
            and concurrency[0] <= concurrency[1]
        )
    )
    if not ok_pool:
        raise SettingsError(
            f"`concurrency` must be a number of actors >= 1 or a (min, max) pair with "
            f"1 <= min <= max (got {concurrency!r})."
        )
    for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise SettingsError(f"`{name}` must be a number >= 0 (got {value!r}).")
    if num_cpus == 0 and num_gpus == 0:
        raise SettingsError("An actor needs some resource: give `num_cpus` > 0 or `num_gpus` > 0.")
    for name, value in (("feature_columns", feature_columns), ("keep_columns", keep_columns)):
        if value is not None and (isinstance(value, str) or not all(isinstance(c, str) for c in value)):
            raise SettingsError(f"`{name}` must be a list of column names (got {value!r}).")
    overlap = set(feature_columns or ()) & set(keep_columns or ())
    if overlap:
        raise SettingsError(
            f"{sorted(overlap)} are in both `feature_columns` and `keep_columns`; a kept column "
            "is copied to the output, not fed to the model."
        )


def _reader_of(data: Any) -> Any:
    """A function that makes the Ray Dataset of ``data``, checked now (without Ray)."""
    import ray.data

    if isinstance(data, ray.data.Dataset):
        return lambda: data
    if isinstance(data, np.ndarray):
        if data.ndim < 1 or len(data) == 0:
            raise DataError(f"`data` is a numpy array of shape {data.shape}; give at least one row.")
        return lambda: ray.data.from_numpy(data)
    if type(data).__name__ == "DataFrame" and hasattr(data, "columns"):
        if len(data) == 0:
            raise DataError("`data` is an empty DataFrame; give at least one row.")
        return lambda: ray.data.from_pandas(data)
    if isinstance(data, (str, os.PathLike)):
        location = os.fspath(data)
        location = location if storage.is_uri(location) else str(storage.local_path(location).resolve())
        read = getattr(ray.data, _format_of(location))
        return lambda: read(location)
    raise DataError(
        f"`data` must be a ray.data.Dataset, a numpy array, a pandas DataFrame, or the path/URI of "
        f"Parquet or CSV files (got a {type(data).__name__})."
    )


def _format_of(location: str) -> str:
    """``read_parquet`` or ``read_csv``, from the file's (or the folder's files') extension."""
    base, _ = storage.split_query(location)
    suffix = Path(base).suffix.lower()
    if suffix in _READERS:
        if not storage.exists(location):
            raise DataError(f"`{location}` does not exist.")
        return _READERS[suffix]
    names = storage.files_under(location)
    if not names:
        raise DataError(
            f"`{location}` does not exist or holds no files; give a Parquet or CSV file or a folder of them."
        )
    kinds = {Path(n).suffix.lower() for n in names if not Path(n).name.startswith(("_", "."))} & set(_READERS)
    if len(kinds) != 1:
        found = sorted({Path(n).suffix or n for n in names})[:6]
        raise DataError(f"`{location}` must hold .parquet or .csv files, one kind (found {found}).")
    return _READERS[kinds.pop()]


def _check_columns(dataset: Any, wanted: list[str]) -> None:
    columns = dataset.columns()
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise DataError(f"The data has no column(s) {missing}; it has {columns}.")


def _check_signature(model: Any, dataset: Any, feature_columns: Any, keep_columns: Any) -> None:
    """A model instance with an input signature and the default ``predict_batch_preprocess``: the
    rows its feature columns make (from the data's schema, nothing read) must fit it, checked before
    any actor starts. Each actor checks every batch too (what a reference's model or a custom
    ``predict_batch_preprocess`` makes)."""
    sig = signature.of_model(model)
    custom = getattr(type(model), "predict_batch_preprocess", None)
    if not sig or getattr(model, "input_schema", None) is not None or custom is None:
        return
    if custom.__qualname__ != "RayModel.predict_batch_preprocess":
        return
    schema = dataset.schema()
    types = dict(zip(schema.names, schema.types))
    names = list(feature_columns or [n for n in schema.names if n not in keep_columns])
    shapes = [tuple(getattr(types.get(n), "shape", None) or ()) for n in names]
    if len(shapes) == 1:
        row = shapes[0] or (1,)
    else:
        row = (sum(int(np.prod(shape)) for shape in shapes),)
    try:
        signature.check(sig, np.empty((0, *row), np.float32))
    except DataError as exc:
        raise DataError(f"`predict_batch` of `{type(model).__name__}` (columns {names}): {exc}.") from None


def _source_of(model_or_ref: Any, registry: str | None) -> dict[str, Any]:
    """What each actor loads: a registry version (resolved now), a checkpoint, or a checkpoint
    of a model instance's current weights written for this call."""
    if isinstance(model_or_ref, (str, os.PathLike)) or type(model_or_ref).__name__ == "ModelRef":
        ref = os.fspath(model_or_ref) if isinstance(model_or_ref, os.PathLike) else str(model_or_ref)
        if sources.is_checkpoint_path(ref):
            from raymodel.contract.checkpoint import MANIFEST

            location = ref if storage.is_uri(ref) else str(Path(ref).resolve())
            if not storage.exists(storage.join(location, MANIFEST)):  # the manifest only: each actor checks
                raise CheckpointError(  # every file's checksum when it loads, so nothing is downloaded twice
                    f"`{ref}` is not a raymodel checkpoint: it has no `{MANIFEST}`. Pass a folder that `train()` "
                    "returned as `.checkpoint`, or one written by `model.save()`."
                )
            return {"checkpoint": location}
        source, info = sources.registry_source(ref, registry)
        return {**source, "version": info["resolved"]}
    if hasattr(model_or_ref, "backend") and callable(getattr(model_or_ref, "save", None)):
        return {"checkpoint": _snapshot(model_or_ref)}
    raise SettingsError(
        f"`predict_batch` takes a model, a registry reference like 'digits@production' or a "
        f"checkpoint path (got a {type(model_or_ref).__name__})."
    )


def _snapshot(model: Model) -> str:
    """A checkpoint of the instance's current weights under ``$RAYMODEL_HOME/predict`` (any node
    reads it there), removed when this process ends: the lazy result may run any time before."""
    parent = locations.home_path("predict")
    if not storage.is_uri(parent):
        Path(parent).mkdir(parents=True, exist_ok=True)
        tmp.collect(Path(parent), "model")  # the snapshots of processes that were killed
    location = model.save(storage.join(parent, tmp.owned_name("model")))
    atexit.register(storage.delete, location)
    return location
