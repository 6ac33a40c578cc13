"""A backend's inference (``Backend.inference``): what a model that defines none of ``forward``,
``preprocess``, ``postprocess`` or the batch hooks is served and batch-predicted with, and the mode
``forward`` runs in at prediction time.

Every backend has one: ``Inference``'s defaults (rows in, plain lists out), or a subclass of the
framework's (``TorchInference``, ``TreeInference``, ...). The drivers (``model.predict``, a serving
replica, ``predict_batch``'s scorer) ask ``model.backend.inference`` and nothing else of the backend."""

from __future__ import annotations

import contextlib
from typing import Any, Generic, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from raymodel.contract._arrays import columns_of, features_of, rows_of, split_nested, to_jsonable

#: The model type a backend serves (``Model``, given by ``Backend``).
M = TypeVar("M")


class Inference(Generic[M]):
    """How a backend's models answer; a backend's subclass overrides what its framework does otherwise."""

    def forward(self, model: M, x: Any) -> Any:
        """Default ``forward`` when the user's class does not define one."""
        raise NotImplementedError(f"`{type(model).__name__}` must define `forward(x)`.")

    def preprocess(self, model: M, payload: Any) -> Any:
        """Default ``preprocess``: the payload as a float32 array of rows."""
        return rows_of(payload)

    def postprocess(self, model: M, output: Any) -> Any:
        """Default ``postprocess``: the output as plain lists."""
        return to_jsonable(output)

    @contextlib.contextmanager
    def mode(self, model: M) -> Iterator[None]:
        """Around ``forward`` at prediction time (eval mode, no gradients)."""
        yield

    def stream(self, model: M, payload: Any) -> Iterator[str]:
        """The answer to ``payload`` piece by piece (a request with ``"stream": true``; served as
        server-sent events). A ``ValueError`` (a 422 when served) for a model that does not stream."""
        raise ValueError(f"`{type(model).__name__}` does not stream its answers; leave `stream` out of the request")

    def batch_input(self, model: M, batch: Mapping[str, np.ndarray]) -> Any:
        """Default ``predict_batch_preprocess``: the feature columns as one float32 array of rows,
        in the form this backend's ``preprocess`` gives ``forward`` (a tensor for torch)."""
        return self.preprocess(model, features_of(batch))

    def batch_output(self, model: M, output: Any) -> dict[str, np.ndarray]:
        """Default ``predict_batch_postprocess``: ``{"prediction": output}`` as numpy (a dict output
        gives one column per key)."""
        return columns_of(output)

    def stack(self, inputs: Sequence[Any]) -> Any:
        """Concatenate per-request inputs along the batch dimension."""
        return np.concatenate([np.asarray(x) for x in inputs], axis=0)

    def split(self, output: Any, sizes: Sequence[int]) -> list[Any]:
        """Split a batched output back into per-request pieces of the given sizes."""
        return split_nested(output, sizes)
