"""The backend seam: everything framework-specific, and nothing else.

A backend tells the drivers in ``train/``, ``tune/`` and ``serve/``:

* how to build the Ray Train trainer and the function each worker runs,
* how to get, write, read and set the model's state (the framework's own save/load),
* how to run inference: default ``forward``/``preprocess``/``postprocess``,
  stacking per-request inputs into one batch and splitting the output back.

Adding a framework means writing one subclass here and one model base class;
the drivers never ask which backend they hold.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from raymodel.exceptions import ModelDefinitionError

if TYPE_CHECKING:
    from raymodel.data import DataSpec
    from raymodel.model import RayModel


class Backend:
    """Base contract of a backend. Subclasses implement every method that raises."""

    #: Short name written into checkpoints ("torch", "xgboost", ...).
    name: str = ""
    #: pip extra that installs the framework: ``pip install 'raymodel[<extra>]'``.
    extra: str = ""
    #: Distribution names whose versions are recorded in checkpoints.
    packages: tuple[str, ...] = ()
    #: Methods a user's subclass must define (checked before any Ray resource is taken).
    required_methods: tuple[str, ...] = ("setup",)
    #: Name of the "epoch" unit in progress output.
    epoch_unit: str = "epoch"

    # ------------------------------------------------------------- checking
    def import_framework(self) -> None:
        """Import the framework, or raise ``MissingDependencyError`` naming the extra."""

    def validate_model(self, model: "RayModel") -> None:
        """Raise :class:`ModelDefinitionError` if the model lacks a required method."""
        base = self.model_base()
        missing = [m for m in self.required_methods
                   if getattr(type(model), m, None) is getattr(base, m, None)]
        if missing:
            names = ", ".join(f"`{m}`" for m in missing)
            raise ModelDefinitionError(
                f"`{type(model).__name__}` must define {names} to be trained with the "
                f"{self.name} backend. See the table 'What a subclass writes' in the README."
            )

    @classmethod
    def model_base(cls) -> type:
        """The public model base class of this backend (e.g. ``RayTorchModel``)."""
        raise NotImplementedError("The 'model_base' method must be implemented.")

    def validate_data(self, data: "DataSpec") -> None:
        """Raise ``DataError`` when the data's form is not usable by this backend."""

    # ------------------------------------------------------------- training
    def train_loop(self) -> Callable[[dict[str, Any]], Any]:
        """The ``train_loop_per_worker`` function given to the Ray trainer."""
        raise NotImplementedError("The 'train_loop' method must be implemented.")

    def make_trainer(self, train_loop: Callable[[dict[str, Any]], Any], *, train_loop_config: dict[str, Any],
                     scaling_config: Any, run_config: Any, datasets: dict[str, Any] | None) -> Any:
        """Build the Ray Train V2 trainer (``TorchTrainer``, ``XGBoostTrainer``, ...)."""
        raise NotImplementedError("The 'make_trainer' method must be implemented.")

    # ---------------------------------------------------------------- state
    def after_user_setup(self, model: "RayModel", returned: Any) -> None:
        """Called with what the user's ``setup`` returned (Lightning returns a module)."""

    def get_state(self, model: "RayModel") -> dict[str, Any]:
        """The model's state as a dict (``on_save_checkpoint`` may add entries)."""
        raise NotImplementedError("The 'get_state' method must be implemented.")

    def write_state(self, model: "RayModel", state: dict[str, Any], directory: Path) -> None:
        """Write ``state`` into ``directory`` with the framework's own saver."""
        raise NotImplementedError("The 'write_state' method must be implemented.")

    def read_state(self, model: "RayModel", directory: Path) -> dict[str, Any]:
        """Read what :meth:`write_state` wrote (the model is already set up)."""
        raise NotImplementedError("The 'read_state' method must be implemented.")

    def set_state(self, model: "RayModel", state: dict[str, Any]) -> None:
        """Load ``state`` into the (set up) model."""
        raise NotImplementedError("The 'set_state' method must be implemented.")

    # ------------------------------------------------------------ inference
    def forward(self, model: "RayModel", x: Any) -> Any:
        """Default ``forward`` when the user's class does not define one."""
        raise NotImplementedError(f"`{type(model).__name__}` must define `forward(x)`.")

    def preprocess(self, model: "RayModel", payload: Any) -> Any:
        """Default ``preprocess``: the payload as a float32 array."""
        return np.asarray(payload, dtype=np.float32)

    def postprocess(self, model: "RayModel", output: Any) -> Any:
        """Default ``postprocess``: the output as plain lists."""
        return to_jsonable(output)

    @contextlib.contextmanager
    def inference(self, model: "RayModel") -> Iterator[None]:
        """Context for ``forward`` at prediction time (eval mode, no gradients)."""
        yield

    def stack(self, inputs: Sequence[Any]) -> Any:
        """Concatenate per-request inputs along the batch dimension."""
        return np.concatenate([np.asarray(x) for x in inputs], axis=0)

    def split(self, output: Any, sizes: Sequence[int]) -> list[Any]:
        """Split a batched output back into per-request pieces of the given sizes."""
        return _split_nested(output, sizes)


def batch_len(x: Any) -> int:
    """Number of rows of a (possibly nested) batch: the first array-like's length."""
    if isinstance(x, dict):
        return batch_len(next(iter(x.values())))
    if isinstance(x, (list, tuple)) and x and hasattr(x[0], "shape"):
        return batch_len(x[0])
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return len(x)


def _split_nested(output: Any, sizes: Sequence[int]) -> list[Any]:
    if isinstance(output, dict):
        parts = {k: _split_nested(v, sizes) for k, v in output.items()}
        return [{k: parts[k][i] for k in output} for i in range(len(sizes))]
    if isinstance(output, tuple):
        parts_t = [_split_nested(v, sizes) for v in output]
        return [tuple(p[i] for p in parts_t) for i in range(len(sizes))]
    pieces, start = [], 0
    for n in sizes:
        pieces.append(output[start:start + n])
        start += n
    return pieces


def to_jsonable(value: Any) -> Any:
    """Arrays and tensors to nested lists, recursively; leaves plain values alone."""
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
