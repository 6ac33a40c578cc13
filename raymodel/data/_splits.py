"""The forms a data split can take, and turning user data into them.

``resolve(data)`` runs on the driver and checks everything it can before Ray
is touched; the resulting ``DataSpec`` is shipped to the workers, where
``DataSpec.materialize(config)`` gives each backend a dict of splits.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
from typing import Any, Mapping

import numpy as np

from raymodel._internal import serialization
from raymodel.exceptions import DataError

SPLIT_NAMES = ("train", "valid")
_ALIASES = {"validation": "valid", "val": "valid", "eval": "valid", "training": "train"}


@dataclasses.dataclass
class Arrays:
    """In-memory features ``x`` and optional labels ``y`` (numpy, same number of rows)."""

    x: Any
    y: Any = None

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def fetch(self) -> Arrays:
        """Resolve object-store references (on a worker)."""
        return Arrays(_fetch(self.x), _fetch(self.y))


@dataclasses.dataclass(frozen=True)
class InStore:
    """One array of a run's in-memory splits, which ``DataSpec.for_workers`` puts in Ray's object store
    together as ``{split: (x, y)}`` (one ``ray.put``: each costs about a millisecond). ``ref`` is a Ray
    object: a job's payload carries it as a Ray argument (``jobs/_request.py``), never pickled."""

    ref: Any
    split: str
    part: int  # 0: x, 1: y


def _fetch(value: Any) -> Any:
    import ray

    if isinstance(value, InStore):
        return ray.get(value.ref)[value.split][value.part]  # zero-copy views of the stored arrays
    return ray.get(value) if in_object_store(value) else value


@dataclasses.dataclass
class TorchDataset:
    """A map-style ``torch.utils.data.Dataset`` (``__getitem__`` and ``__len__``)."""

    dataset: Any


@dataclasses.dataclass
class Batches:
    """A re-iterable (sync or async) of ready batches; each epoch iterates it again."""

    iterable: Any
    is_async: bool = False


@dataclasses.dataclass
class RayDataset:
    """A ``ray.data`` Dataset, handed to the trainer and read with ``get_dataset_shard``.

    On a pool of the training server the run was not started with the job's
    datasets: the job splits each one for the workers itself (``streaming_split``,
    equal shards, as Ray Train's ``DataConfig`` does) and ``shards`` holds one
    iterator per rank.
    """

    key: str
    dataset: Any = None  # kept on the driver only
    shards: list[Any] | None = None

    def shard(self, rank: int) -> Any:
        """This worker's ``DataIterator``."""
        if self.shards is not None:
            return self.shards[rank]
        import ray.train

        return ray.train.get_dataset_shard(self.key)


@dataclasses.dataclass
class DataSpec:
    """What a verb was given as data, checked and ready to ship to the workers."""

    splits: dict[str, Any] = dataclasses.field(default_factory=dict)
    module: Any = None  # an object with setup(config) -> splits, run on each worker
    module_blob: bytes | None = None  # the module, cloudpickled by value for the workers
    #: The training inputs' shape beyond the rows and dtype (``raymodel._internal.signature``), when known.
    signature: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.signature is None and "train" in self.splits:
            self.signature = _signature_of(self.splits["train"])

    @property
    def ray_datasets(self) -> dict[str, Any]:
        return {s.key: s.dataset for s in self.splits.values() if isinstance(s, RayDataset)}

    @property
    def has_validation(self) -> bool | None:
        """Whether there is a ``valid`` split (``None``: a data module decides on the worker)."""
        if self.module is not None or self.module_blob is not None:
            return None
        return "valid" in self.splits

    def for_workers(self) -> DataSpec:
        """A copy with arrays in Ray's object store (every split's, as one object) and ``ray.data``
        Datasets left out."""
        import ray

        here = {n: (s.x, s.y) for n, s in self.splits.items() if isinstance(s, Arrays) and not in_object_store(s.x)}
        ref = ray.put(here) if here else None
        splits = {}
        for name, split in self.splits.items():
            if name in here:
                split = Arrays(InStore(ref, name, 0), None if split.y is None else InStore(ref, name, 1))
            elif isinstance(split, RayDataset):
                split = RayDataset(split.key)
            splits[name] = split
        blob = self.module_blob
        if self.module is not None:
            blob = serialization.dumps(self.module, self.module)
        return DataSpec(splits, None, blob, signature=self.signature)

    def materialize(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """On a worker: the splits, with arrays fetched and a data module set up."""
        module = self.module if self.module_blob is None else serialization.loads(self.module_blob)
        if module is not None:
            returned = module.setup(dict(config))
            return dict(_splits_from_mapping(returned, where=f"`{type(module).__name__}.setup(config)`").splits)
        return {name: split.fetch() if isinstance(split, Arrays) else split for name, split in self.splits.items()}


def _signature_of(split: Any) -> dict[str, Any] | None:
    """The shape and dtype of a training split's inputs, where it can be seen without reading it:
    arrays, a torch ``Dataset``'s first item, a list's first batch."""
    from raymodel._internal import signature

    try:
        if isinstance(split, Arrays):
            return signature.of_array(split.x)
        if isinstance(split, TorchDataset):
            item = split.dataset[0]
            return signature.of_array(item[0] if isinstance(item, (tuple, list)) else item, rows=False)
        if isinstance(split, Batches) and isinstance(split.iterable, cabc.Sequence) and len(split.iterable):
            batch = split.iterable[0]
            return signature.of_array(batch[0] if isinstance(batch, (tuple, list)) else batch)
    except Exception:  # noqa: BLE001 - a dataset whose first item cannot be read here records none
        return None
    return None


def kind_of(split: Any) -> str:
    """The form of one split: ``arrays``, ``torch_dataset``, ``batches``, ``async_batches`` or ``ray_dataset``."""
    if isinstance(split, Arrays):
        return "arrays"
    if isinstance(split, TorchDataset):
        return "torch_dataset"
    if isinstance(split, Batches):
        return "async_batches" if split.is_async else "batches"
    if isinstance(split, RayDataset):
        return "ray_dataset"
    raise TypeError(f"Not a data split: {type(split).__name__}")


def resolve(data: Any) -> DataSpec:
    """Check ``data`` and turn it into a ``DataSpec``, or raise ``DataError``."""
    if data is None:
        raise DataError(
            "No data given: pass `data=`, e.g. `data=rm.data.from_numpy(X, y)` or "
            "`data={'train': (X, y), 'valid': (X_val, y_val)}`."
        )
    if isinstance(data, DataSpec):
        return data
    if isinstance(data, Mapping):
        return _splits_from_mapping(data, where="`data`")
    if callable(getattr(data, "setup", None)) and not is_ray_dataset(data):
        _check_module(data)
        return DataSpec(module=data)
    return DataSpec({"train": to_split(data, "train", where="`data`")})


def _check_module(module: Any) -> None:
    """A data module is an instance whose ``setup(config)`` returns the splits, on each worker: refuse,
    now, a class (its ``setup`` would miss ``self``) and a ``setup`` that cannot take the config."""
    import inspect

    name = getattr(module, "__name__", type(module).__name__)
    if inspect.isclass(module):
        raise DataError(
            f"`data` is the class `{name}`; a data module is an instance of it: pass `{name}()` "
            "(`--data module:Class` instantiates the class itself)."
        )
    try:
        inspect.signature(module.setup).bind({})
    except TypeError:
        raise DataError(
            f"`data` is a data module (`{name}`) whose `setup{inspect.signature(module.setup)}` cannot take the "
            "config; define `def setup(self, config): ...` returning {'train': ..., 'valid': ...}."
        ) from None
    except ValueError:  # a builtin without a signature: let it run
        pass


def _splits_from_mapping(data: Any, where: str) -> DataSpec:
    if isinstance(data, DataSpec):
        return data
    if not isinstance(data, Mapping):
        raise DataError(f"{where} must return a dict like {{'train': ..., 'valid': ...}} (got {type(data).__name__}).")
    splits = {}
    for key, value in data.items():
        name = _ALIASES.get(key, key)
        if name not in SPLIT_NAMES:
            raise DataError(f"{where} has an unknown split `{key}`; the splits are `train` and `valid`.")
        if value is not None:
            splits[name] = to_split(value, name, where=f"{where}[{key!r}]")
    if "train" not in splits:
        raise DataError(f"{where} has no `train` split (got keys {sorted(map(str, data))}).")
    train, valid = splits.get("train"), splits.get("valid")
    if isinstance(train, Arrays) and isinstance(valid, Arrays):
        for part in ("x", "y"):
            a, b = getattr(train, part), getattr(valid, part)
            if (a is None) != (b is None) or (a is not None and a.shape[1:] != b.shape[1:]):
                what = "X" if part == "x" else "y"
                raise DataError(
                    f"{where}: the `train` and `valid` {what} differ in shape beyond the rows "
                    f"(train {what}: {_shape(a)}, valid {what}: {_shape(b)}); they must match."
                )
    return DataSpec(splits)


def _shape(a: Any) -> str:
    return "none" if a is None else f"shape {tuple(a.shape)}"


def nonfinite(spec: DataSpec) -> list[str]:
    """``"split 'train' X: 3 of 640 values"`` for every in-memory array holding NaN or infinity."""
    found = []
    for name, split in spec.splits.items():
        for part, what in (("x", "X"), ("y", "y")):
            a = getattr(split, part, None) if isinstance(split, Arrays) else None
            if a is not None and not in_object_store(a) and np.issubdtype(a.dtype, np.inexact):
                bad = int(np.count_nonzero(~np.isfinite(a)))
                if bad:
                    found.append(f"split {name!r} {what}: {bad} of {a.size} values")
    return found


def to_split(value: Any, name: str, where: str) -> Any:
    """One split from a tuple of arrays, an array, a DataFrame, a Dataset, or an iterable."""
    if isinstance(value, (Arrays, TorchDataset, Batches, RayDataset)):
        return value
    if isinstance(value, tuple):
        if len(value) not in (1, 2):
            raise DataError(f"{where} must be `(X, y)` or `(X,)` (got a tuple of {len(value)}).")
        return make_arrays(value[0], value[1] if len(value) == 2 else None, where)
    if isinstance(value, np.ndarray) or _is_dataframe(value):
        return make_arrays(value, None, where)
    if is_ray_dataset(value):
        return RayDataset(name, value)
    if hasattr(value, "__getitem__") and hasattr(value, "__len__") and _is_torch_dataset(value):
        if len(value) == 0:
            raise DataError(f"{where} is an empty Dataset.")
        return TorchDataset(value)
    if hasattr(value, "__aiter__"):
        return Batches(value, is_async=True)
    if isinstance(value, cabc.Iterable) and not isinstance(value, (str, bytes)):
        if isinstance(value, cabc.Iterator):
            raise DataError(
                f"{where} is a one-shot iterator (e.g. a generator), which cannot be re-read each epoch. "
                "Pass a re-iterable: a list of batches, a `DataLoader`, or an object whose `__iter__` "
                "starts over."
            )
        if isinstance(value, cabc.Sized) and len(value) == 0:
            raise DataError(
                f"{where} is empty (no batches): training on it would return an untrained model. "
                "Pass at least one batch, or `(X, y)` arrays."
            )
        return Batches(value)
    raise DataError(
        f"{where} has an unsupported type `{type(value).__name__}`. Use `(X, y)` numpy arrays, "
        "a pandas DataFrame via `rm.data.from_pandas`, a torch `Dataset`, a `ray.data` Dataset, "
        "or an iterable of batches."
    )


def make_arrays(x: Any, y: Any, where: str) -> Arrays:
    """Checked feature and label arrays (numeric, real, the same number of rows)."""
    x = _as_array(x, f"{where} X")
    if x.ndim == 0 or x.shape[0] == 0:
        raise DataError(f"{where}: X must have at least one row (got shape {x.shape}).")
    if y is not None:
        y = _as_array(y, f"{where} y")
        if y.ndim == 0 or y.shape[0] != x.shape[0]:
            raise DataError(
                f"{where}: X and y must have the same number of rows "
                f"(got X with shape {x.shape} and y with shape {y.shape})."
            )
        if np.issubdtype(y.dtype, np.unsignedinteger) and y.size and int(y.max()) > np.iinfo(np.int64).max:
            raise DataError(
                f"{where} y holds unsigned labels up to {int(y.max())}, which do not fit in int64 and "
                "would wrap around to negative numbers; re-encode the labels (e.g. `np.unique(y, "
                "return_inverse=True)[1]`)."
            )
    return Arrays(x, y)


def _as_array(value: Any, what: str) -> np.ndarray:
    if _is_dataframe(value) or hasattr(value, "to_numpy"):
        value = value.to_numpy()
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except Exception as exc:  # ragged lists and the like
        raise DataError(f"{what} cannot be turned into an array: {exc}") from exc
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise DataError(f"{what} must be numeric (got dtype {array.dtype}). Encode categories as numbers first.")
    if np.issubdtype(array.dtype, np.complexfloating):
        raise DataError(
            f"{what} is complex ({array.dtype}); models here take real numbers and the imaginary "
            "part would be dropped. Pass `X.real` and `X.imag` as separate features."
        )
    return array


def in_object_store(value: Any) -> bool:
    """In Ray's object store: an ``ObjectRef``, or one array of a run's splits stored together."""
    return type(value).__name__ == "ObjectRef" or isinstance(value, InStore)


def _is_dataframe(value: Any) -> bool:
    return type(value).__name__ == "DataFrame" and hasattr(value, "columns")


def is_ray_dataset(value: Any) -> bool:
    """Whether ``value`` is a ``ray.data`` Dataset (without importing Ray Data)."""
    cls = type(value)
    return cls.__module__.startswith("ray.data") and cls.__name__ in ("Dataset", "MaterializedDataset")


def _is_torch_dataset(value: Any) -> bool:
    return any(c.__module__.startswith("torch.utils.data") and c.__name__ == "Dataset" for c in type(value).__mro__)
