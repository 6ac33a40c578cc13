"""A backend's checks of data (``Backend`` inherits them): which forms of split it trains on, each split's
shape, the input signature a checkpoint records, and what a model with none is checked against."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from raymodel.data import DataSpec, kind_of
from raymodel.exceptions import DataError

#: Every form a data split can take (``raymodel.data.kind_of``).
DATA_KINDS = ("arrays", "torch_dataset", "batches", "async_batches", "ray_dataset")


#: Why a network with no recorded signature refuses NaN, None or infinity (``unrecorded_signature``).
UNRECORDED_NAN = (
    "a network answers NaN for them (the model has no recorded input signature: clean the input, or train it "
    "with `TrainSettings(nonfinite='allow')` to let them through)"
)

_DATA_HINTS = {
    "arrays": "Pass `rm.data.from_numpy(X, y)`, `rm.data.from_pandas(df, label=...)` or `(X, y)` tuples.",
}

#: The model type a backend checks (``Model``, given by ``Backend``).
M = TypeVar("M")


class DataChecks(Generic[M]):
    """``Backend``'s data checks; ``name`` and ``accepts`` are ``Backend``'s."""

    name: ClassVar[str]
    accepts: ClassVar[tuple[str, ...]]

    def validate_data(self, data: DataSpec) -> None:
        """Raise ``DataError`` when a split's form is not in ``accepts`` or its shape is wrong.

        Runs on the driver before Ray is touched, and on each worker for the
        splits a data module returns.
        """
        for split_name, split in data.splits.items():
            kind = kind_of(split)
            if kind not in self.accepts:
                forms = ", ".join(f"`{k}`" for k in self.accepts)
                raise DataError(
                    f"The {self.name} backend does not train on {kind.replace('_', ' ')} "
                    f"(split {split_name!r} is one); it takes: {forms}. "
                    f"{_DATA_HINTS.get(self.accepts[0], '')}"
                )
            self.check_split(split_name, split)

    def prepare_data(self, model: M, data: Any) -> Any:
        """On the driver, before ``raymodel.data.resolve``: turn ``data`` into a form ``resolve`` takes.
        The identity by default; the transformers backend tokenizes Hugging Face datasets, frames and dicts
        of lists here, once per dataset. A ``DataSpec`` (already prepared) is passed through unchanged."""
        return data

    def check_split(self, name: str, split: Any) -> None:
        """Backend-specific checks of one accepted split (e.g. 2-D features); may raise ``DataError``."""

    def input_signature(self, model: M, spec: DataSpec) -> dict[str, Any] | None:
        """The shape and dtype of what ``forward`` takes (``raymodel._internal.signature``), recorded in every
        checkpoint: the training data's by default."""
        return spec.signature

    def unrecorded_signature(self, model: M) -> dict[str, Any] | None:
        """What a model with no recorded signature (untrained, or built in code) is checked against
        before ``forward``: what the model itself says of its input (a built Keras model's input shape,
        a booster's number of features), and the ``nonfinite`` policy of the framework (NaN is a
        missing value to a boosted tree, a silent NaN answer to a network). ``None``: no check."""
        return None
