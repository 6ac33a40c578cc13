"""The data of a ``RayTransformersModel``, on the driver: every form a Hugging Face user holds text in,
turned into tokenized ``datasets.Dataset`` splits once, before any Ray resource is taken.

Forms: a ``datasets.Dataset`` or ``DatasetDict``, a ``ray.data`` Dataset (read on the driver), a pandas
DataFrame, a dict of columns (``{"text": [...], "label": [...]}``), or ``{"train": ..., "valid": ...}``
of any of them. ``tokenize`` runs once per dataset (``Dataset.map``, batched; the same dataset and
model config tokenized again in this process is taken from a small cache), never per epoch or per
worker: the workers get the tokenized splits.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import json
from typing import Any, Iterator, Mapping

from raymodel.data import DataSpec, TorchDataset, is_ray_dataset
from raymodel.exceptions import DataError, ModelDefinitionError

#: Split names of a dict of splits (``DatasetDict``'s ``validation``/``test`` included).
SPLITS = {
    "train": "train",
    "training": "train",
    "valid": "valid",
    "validation": "valid",
    "val": "valid",
    "eval": "valid",
}
#: Label columns the ``Trainer`` passes to the model.
LABELS = ("label", "labels", "label_ids")
_CACHE: collections.OrderedDict[tuple[Any, ...], Any] = collections.OrderedDict()
_CACHE_SIZE = 8


def prepare(model: Any, data: Any) -> DataSpec:
    """``data`` -> a ``DataSpec`` of tokenized ``datasets.Dataset`` splits (``TorchDataset``), or ``DataError``."""
    if callable(getattr(data, "setup", None)) and not is_ray_dataset(data):
        raise DataError(
            f"A data module (`{type(data).__name__}.setup`) is not supported by the transformers backend; pass "
            "the datasets themselves: a `datasets.Dataset`/`DatasetDict`, a DataFrame or a dict of columns."
        )
    model.ensure_setup()  # the tokenizer is built in `setup`
    splits = named_splits(data)
    task = task_of(model.model)
    out = {}
    for name, value in splits.items():
        dataset = to_dataset(value, f"`data[{name!r}]`" if len(splits) > 1 or name != "train" else "`data`")
        out[name] = TorchDataset(tokenized(model, dataset, name, task))
    return DataSpec(out)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Without the progress bars of ``datasets`` (a map) and transformers (saving and loading weights):
    raymodel prints a run's own progress, and a served model loads without a bar in its log."""
    from datasets.utils import logging as datasets_logging
    from transformers.utils import logging as transformers_logging

    shown = (datasets_logging.is_progress_bar_enabled(), transformers_logging.is_progress_bar_enabled())
    datasets_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown[0]:
            datasets_logging.enable_progress_bar()
        if shown[1]:
            transformers_logging.enable_progress_bar()


def task_of(hf_model: Any) -> str:
    """``"classification"``, ``"causal_lm"`` or ``"other"``, from the model's class."""
    name = type(hf_model).__name__
    if name.endswith("ForSequenceClassification"):
        return "classification"
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    return "other"


def named_splits(data: Any) -> dict[str, Any]:
    if isinstance(data, Mapping):
        keys = [str(k) for k in data]
        if any(k in SPLITS for k in keys) or type(data).__name__ == "DatasetDict":
            unknown = [k for k in keys if k not in SPLITS and k != "test"]
            if unknown:
                raise DataError(
                    f"`data` has splits {keys}: `{unknown[0]}` is not one raymodel knows; name them `train` and "
                    "`valid` (or `validation`)."
                )
            splits = {SPLITS[k]: v for k, v in data.items() if k in SPLITS and v is not None}
            if "train" not in splits:
                raise DataError(f"`data` has no `train` split (got {keys}).")
            return splits
        return {"train": data}  # a dict of columns
    return {"train": data}


def to_dataset(value: Any, where: str) -> Any:
    """A ``datasets.Dataset`` from any of the forms, or ``DataError`` naming what was given."""
    import datasets

    if isinstance(value, datasets.Dataset):
        dataset = value
    elif is_ray_dataset(value):
        dataset = datasets.Dataset.from_pandas(value.to_pandas(), preserve_index=False)
    elif type(value).__name__ == "DataFrame" and hasattr(value, "columns"):
        dataset = datasets.Dataset.from_pandas(value, preserve_index=False)
    elif isinstance(value, Mapping) and value and all(isinstance(v, (list, tuple)) for v in value.values()):
        lengths = {k: len(v) for k, v in value.items()}
        if len(set(lengths.values())) > 1:
            raise DataError(f"{where}: the columns differ in length ({lengths}); every column needs one entry per row.")
        dataset = datasets.Dataset.from_dict({str(k): list(v) for k, v in value.items()})
    else:
        raise DataError(
            f"{where} is a {type(value).__name__}; the transformers backend trains on a `datasets.Dataset` "
            "(or `DatasetDict`), a `ray.data` Dataset, a pandas DataFrame, or a dict of columns such as "
            "`{'text': [...], 'label': [...]}`."
        )
    if len(dataset) == 0:
        raise DataError(f"{where} has no rows: training on it would return an untrained model.")
    return dataset


def tokenized(model: Any, dataset: Any, split: str, task: str) -> Any:
    """``dataset`` with ``model.tokenize``'s columns (and the label), checked on two rows first."""
    method = type(model).tokenize
    code = getattr(method, "__code__", method)
    key = (dataset._fingerprint, type(model).__qualname__, code, _config_key(model.config))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    columns = list(dataset.column_names)
    labels = [c for c in columns if c in LABELS]
    if task == "classification" and not labels:
        raise DataError(
            f"The `{split}` split has no label column (columns: {columns}); "
            f"`{type(model.model).__name__}` needs one: name it `label`."
        )
    sample = _tokenize(model, dataset[:2])
    accepted = _accepted_inputs(model.model)
    extra = sorted(k for k in sample if k not in accepted and k not in LABELS)
    if extra:
        raise ModelDefinitionError(
            f"`{type(model).__name__}.tokenize` returned {extra}, which `{type(model.model).__name__}.forward` "
            f"does not take (it takes {sorted(accepted)}); return only the model's inputs."
        )
    if not sample:
        raise ModelDefinitionError(f"`{type(model).__name__}.tokenize` returned no columns.")
    with quiet():
        result = dataset.map(
            lambda batch: _tokenize(model, batch), batched=True, remove_columns=[c for c in columns if c not in labels]
        )
    _CACHE[key] = result
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return result


def _tokenize(model: Any, batch: dict[str, list[Any]]) -> dict[str, Any]:
    try:
        out = model.tokenize(batch)
    except (ModelDefinitionError, DataError):
        raise
    except Exception as exc:
        raise ModelDefinitionError(
            f"`{type(model).__name__}.tokenize` failed on a batch of columns {sorted(batch)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(out, Mapping):
        raise ModelDefinitionError(
            f"`{type(model).__name__}.tokenize` must return a mapping of the model's inputs "
            f"(`input_ids`, ...); it returned a {type(out).__name__}."
        )
    return {str(k): v for k, v in out.items()}


def _accepted_inputs(hf_model: Any) -> set[str]:
    parameters = inspect.signature(hf_model.forward).parameters
    return {n for n, p in parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=repr)
