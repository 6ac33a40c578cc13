"""The backend seam: everything framework-specific, and nothing else.

A backend is two small classes:

* :class:`Backend` (driver and worker): the facts about the framework
  (name, imports, packages, extra, Ray trainer, accepted data, hooks called),
  the model's state (the framework's own save/load) and inference defaults;
* :class:`WorkerLoop` (train worker): build what training needs, run one
  epoch, evaluate, and get/set the training state.

``WorkerRun`` (``backends/_run.py``) owns the lifecycle around them for every
backend: setup hooks, resuming, the epoch loop, validation hooks, reporting,
checkpointing, stopping. Adding a framework is one module here: a
``Backend``, a ``WorkerLoop`` and a model base class; the drivers in
``train/``, ``tune/`` and ``serve/`` never ask which backend they hold.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Mapping, Sequence

import numpy as np

from raymodel._internal.deps import require
from raymodel.exceptions import DataError, ModelDefinitionError

if TYPE_CHECKING:
    from raymodel.backends._run import WorkerRun
    from raymodel.data import DataSpec
    from raymodel.model import RayModel

#: Every form a data split can take (``raymodel.data.kind_of``).
DATA_KINDS = ("arrays", "torch_dataset", "batches", "async_batches", "ray_dataset")


class Backend:
    """Base contract of a backend: the facts about a framework, its state and its inference.

    Subclasses set the class attributes and implement every method that raises.
    """

    #: Short name written into checkpoints ("torch", "xgboost", ...).
    name: ClassVar[str] = ""
    #: pip extra that installs the framework: ``pip install 'raymodel[<extra>]'``.
    extra: ClassVar[str] = ""
    #: Modules to import (checked before training; pickled by reference, never by value).
    imports: ClassVar[tuple[str, ...]] = ()
    #: Distribution names whose versions are recorded in checkpoints.
    packages: ClassVar[tuple[str, ...]] = ()
    #: The Ray Train V2 trainer class, as ``"module.Class"``.
    trainer: ClassVar[str] = "ray.train.v2.api.data_parallel_trainer.DataParallelTrainer"
    #: The data forms this backend trains on (a subset of :data:`DATA_KINDS`).
    accepts: ClassVar[tuple[str, ...]] = ("arrays",)
    #: Methods a user's subclass must define (checked before any Ray resource is taken).
    required_methods: ClassVar[tuple[str, ...]] = ("setup",)
    #: Name of the "epoch" unit in progress output.
    epoch_unit: ClassVar[str] = "epoch"
    #: How this backend calls hooks, where it differs from "yes": hook name -> note.
    #: A note starting with "no" means the hook is never called (the README's table reads this).
    hook_notes: ClassVar[Mapping[str, str]] = {}
    #: True when the worker loop gathers across workers with the framework's own collective
    #: (:meth:`WorkerLoop.all_gather`); otherwise the run's hub actor carries the values.
    native_collective: ClassVar[bool] = False
    #: True when ``TrainSettings.precision``, ``accumulate_grad_batches`` and the gradient clips
    #: apply (a loop of optimizer steps: torch, Lightning).
    gradient_steps: ClassVar[bool] = False
    #: Keys of the state dict that :meth:`write_state` writes itself; any other entry
    #: (added in ``on_save_checkpoint``) is saved beside them by the checkpoint format.
    state_keys: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------- checking
    def import_framework(self) -> None:
        """Import the framework, or raise ``MissingDependencyError`` naming the extra."""
        for module in self.imports:
            require(module, self.extra)

    def calls(self, hook: str) -> bool:
        """Whether this backend ever calls ``hook`` during training."""
        return not self.hook_notes.get(hook, "yes").startswith("no")

    def validate_model(self, model: "RayModel") -> None:
        """Raise :class:`ModelDefinitionError` if the model lacks a required method."""
        base = next(k for k in reversed(type(model).__mro__) if "backend" in vars(k))  # e.g. RayTorchModel
        missing = [m for m in self.required_methods
                   if getattr(type(model), m, None) is getattr(base, m, None)]
        if missing:
            names = ", ".join(f"`{m}`" for m in missing)
            raise ModelDefinitionError(
                f"`{type(model).__name__}` must define {names} to be trained with the "
                f"{self.name} backend. See the table 'What a subclass writes' in the README."
            )

    def validate_data(self, data: "DataSpec") -> None:
        """Raise ``DataError`` when a split's form is not in :attr:`accepts` or its shape is wrong.

        Runs on the driver before Ray is touched, and on each worker for the
        splits a data module returns.
        """
        from raymodel.data import kind_of

        for split_name, split in data.splits.items():
            kind = kind_of(split)
            if kind not in self.accepts:
                forms = ", ".join(f"`{k}`" for k in self.accepts)
                raise DataError(f"The {self.name} backend does not train on {kind.replace('_', ' ')} "
                                f"(split {split_name!r} is one); it takes: {forms}. "
                                f"{_DATA_HINTS.get(self.accepts[0], '')}")
            self.check_split(split_name, split)

    def check_split(self, name: str, split: Any) -> None:
        """Backend-specific checks of one accepted split (e.g. 2-D features); may raise ``DataError``."""

    # ------------------------------------------------------------- training
    def worker_loop(self, run: "WorkerRun") -> "WorkerLoop":
        """The :class:`WorkerLoop` that trains this backend's model on a worker."""
        raise NotImplementedError("The 'worker_loop' method must be implemented.")

    def make_trainer(self, train_loop: Callable[[dict[str, Any]], Any], *, train_loop_config: dict[str, Any],
                     scaling_config: Any, run_config: Any, datasets: dict[str, Any] | None) -> Any:
        """Build the Ray Train V2 trainer named by :attr:`trainer`, not yet fit."""
        module, _, cls_name = self.trainer.rpartition(".")
        trainer_cls = getattr(importlib.import_module(module), cls_name)
        return trainer_cls(train_loop, train_loop_config=train_loop_config, scaling_config=scaling_config,
                           run_config=run_config, datasets=datasets or None)

    # ---------------------------------------------------------------- state
    def after_user_setup(self, model: "RayModel", returned: Any) -> None:
        """Called with what the user's ``setup`` returned (Lightning returns a module)."""

    def get_state(self, model: "RayModel") -> dict[str, Any]:
        """The model's state as a dict of :attr:`state_keys` (``on_save_checkpoint`` may add entries)."""
        raise NotImplementedError("The 'get_state' method must be implemented.")

    def write_state(self, model: "RayModel", state: dict[str, Any], directory: Path) -> None:
        """Write the :attr:`state_keys` entries of ``state`` into ``directory`` with the framework's own saver."""
        raise NotImplementedError("The 'write_state' method must be implemented.")

    def read_state(self, model: "RayModel", directory: Path) -> dict[str, Any]:
        """Read what :meth:`write_state` wrote (the model is already set up)."""
        raise NotImplementedError("The 'read_state' method must be implemented.")

    def set_state(self, model: "RayModel", state: dict[str, Any]) -> None:
        """Load ``state`` into the (set up) model; entries it has no use for are ignored."""
        raise NotImplementedError("The 'set_state' method must be implemented.")

    # ------------------------------------------------------------ inference
    def forward(self, model: "RayModel", x: Any) -> Any:
        """Default ``forward`` when the user's class does not define one."""
        raise NotImplementedError(f"`{type(model).__name__}` must define `forward(x)`.")

    def preprocess(self, model: "RayModel", payload: Any) -> Any:
        """Default ``preprocess``: the payload as a float32 array of rows."""
        return rows_of(payload)

    def postprocess(self, model: "RayModel", output: Any) -> Any:
        """Default ``postprocess``: the output as plain lists."""
        return to_jsonable(output)

    @contextlib.contextmanager
    def inference(self, model: "RayModel") -> Iterator[None]:
        """Context for ``forward`` at prediction time (eval mode, no gradients)."""
        yield

    def batch_input(self, model: "RayModel", batch: Mapping[str, np.ndarray]) -> Any:
        """Default ``predict_batch_preprocess``: the feature columns as one float32 array of rows,
        in the form this backend's ``preprocess`` gives ``forward`` (a tensor for torch)."""
        return self.preprocess(model, features_of(batch))

    def batch_output(self, model: "RayModel", output: Any) -> dict[str, np.ndarray]:
        """Default ``predict_batch_postprocess``: ``{"prediction": output}`` as numpy (a dict output
        gives one column per key)."""
        return columns_of(output)

    def stack(self, inputs: Sequence[Any]) -> Any:
        """Concatenate per-request inputs along the batch dimension."""
        return np.concatenate([np.asarray(x) for x in inputs], axis=0)

    def split(self, output: Any, sizes: Sequence[int]) -> list[Any]:
        """Split a batched output back into per-request pieces of the given sizes."""
        return _split_nested(output, sizes)


_DATA_HINTS = {
    "arrays": "Pass `rm.data.from_numpy(X, y)`, `rm.data.from_pandas(df, label=...)` or `(X, y)` tuples.",
}


class WorkerLoop:
    """What a backend does on a train worker; ``WorkerRun`` calls it and owns everything around it.

    A loop never calls the epoch-level hooks itself: ``WorkerRun`` does, in
    the one documented order. A loop calls only the batch hooks, through
    ``run.before_batch`` / ``run.after_batch``. A framework with its own fit
    loop (Lightning) overrides :meth:`run_epochs` and calls ``run.begin_epoch``,
    ``run.begin_validation``, ``run.end_validation`` and ``run.end_epoch`` from
    that framework's callback points instead.
    """

    def __init__(self, run: "WorkerRun") -> None:
        self.run = run
        self.model = run.model

    def setup_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Context in which the user's ``setup(config)`` runs (e.g. a distribution strategy's scope)."""
        return contextlib.nullcontext()

    def seed(self, seed: int) -> None:
        """Seed the framework's random generators (Python's and numpy's are seeded already)."""

    def build(self) -> None:
        """After ``setup``, before a checkpoint is restored: optimizers, devices, data."""

    def ready(self) -> None:
        """After the state is restored, before ``before_fit`` (e.g. wrap for DDP)."""

    @property
    def has_validation(self) -> bool:
        return "valid" in self.run.splits

    async def train_epoch(self, epoch: int) -> dict[str, float]:
        """Train one epoch; return its metrics (``loss`` at least), the same on every worker."""
        raise NotImplementedError("The 'train_epoch' method must be implemented.")

    async def validate(self, epoch: int) -> dict[str, float]:
        """Evaluate on the validation split; metrics over the whole split, the same on every worker."""
        raise NotImplementedError("The 'validate' method must be implemented.")

    def end_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        """After ``after_epoch``, before the checkpoint: per-epoch bookkeeping (e.g. LR schedulers)."""

    def batches_per_epoch(self) -> int | None:
        """This worker's training batches per epoch, when known (the progress bar's total)."""
        return None

    async def run_epochs(self, first: int, last: int) -> None:
        """Run epochs ``first..last``, stopping early when ``run.epoch`` says so."""
        for epoch in range(first, last + 1):
            if await self.run.epoch(epoch):
                return

    # ---------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """The training state to checkpoint: the model's, plus optimizers and the like.

        Called on every worker when a checkpoint is due (a framework may save
        collectively); rank 0's is written.
        """
        return self.model.backend.get_state(self.model)

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s state on every worker (after :meth:`build`)."""
        self.model.backend.set_state(self.model, state)

    def all_gather(self, value: Any) -> list[Any]:
        """The framework's own all-gather of a small Python value (with ``Backend.native_collective``)."""
        raise NotImplementedError("The 'all_gather' method must be implemented with `native_collective = True`.")

    def rng_state(self) -> Any:
        """The framework's random generator state on this worker (``None``: nothing to save)."""
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore what :meth:`rng_state` returned."""


def rows_of(payload: Any) -> np.ndarray:
    """A payload as a float32 array of at least one dimension (rows), or a ``ValueError`` saying why not."""
    if payload is None or isinstance(payload, (str, bytes, dict)):
        raise ValueError(f"expected a list of rows of numbers, got {type(payload).__name__}")
    array = np.asarray(payload, dtype=np.float32)
    if array.ndim == 0:
        raise ValueError("expected a list of rows of numbers, got a single number")
    return array


def features_of(batch: Mapping[str, np.ndarray]) -> np.ndarray:
    """A Ray Data batch (column -> array) as one 2-D array of rows: a single column as it is (a
    tensor column of vectors, or one feature), several numeric columns side by side, in order."""
    if not batch:
        raise ValueError("the batch has no feature columns")
    arrays = []
    for name, column in batch.items():
        array = np.asarray(column)
        if array.dtype == object:  # a tensor column of unequal shapes, or Python objects
            try:
                array = np.stack([np.asarray(v, dtype=np.float32) for v in array])
            except (TypeError, ValueError) as exc:
                raise DataError(f"Column {name!r} does not hold numbers ({exc}); pick the feature columns with "
                                "`feature_columns=[...]` or define `predict_batch_preprocess(batch)`.") from None
        elif array.dtype.kind not in "biuf":  # bool, integers, floats
            raise DataError(f"Column {name!r} holds {array.dtype} values, not numbers; pick the feature columns with "
                            "`feature_columns=[...]` or define `predict_batch_preprocess(batch)`.")
        arrays.append(array)
    if len(arrays) == 1:  # a read-only view of the block (zero copy) is copied once, here, for torch's sake
        array = arrays[0] if arrays[0].flags.writeable else arrays[0].copy()
        return array if array.ndim > 1 else array.reshape(-1, 1)
    if all(a.ndim == 1 for a in arrays):  # tabular columns: stacked, then viewed as rows (6x faster than copying
        return np.stack(arrays).T         # them side by side; torch and the boosters take the strided view)
    return np.concatenate([a.reshape(len(a), -1) for a in arrays], axis=1)


def columns_of(output: Any) -> dict[str, np.ndarray]:
    """A model output as Ray Data columns: a dict keeps its keys, anything else is ``"prediction"``."""
    if isinstance(output, Mapping):
        return {str(k): _numpy(v) for k, v in output.items()}
    return {"prediction": _numpy(output)}


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    return np.asarray(value)


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
