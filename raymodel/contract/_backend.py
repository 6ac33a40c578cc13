"""The backend seam: everything framework-specific, and nothing else.

A backend is two small classes:

* ``Backend`` (driver and worker): the facts about the framework (name, imports, packages, extra, accepted
  data, hooks called), the model's state, and its capabilities, each a part of its own: ``training`` (the
  loop and how a run is built, ``contract/_training.py``), ``inference`` (``contract/_inference.py``),
  ``text`` (``contract/_generation.py``), ``pool`` and ``warm_up`` (the training server's);
* ``WorkerLoop`` (train worker): build what training needs, run one epoch, evaluate, get/set its state.

Beside them, the two protocols (PEP 544) that the layers below the plug-ins type against: ``Model`` (a model,
as the drivers use it) and ``RunOnWorker`` (a training run on one worker, as a worker loop sees it).

``WorkerRun`` (``train/_worker_run.py``) owns the lifecycle around them for every backend: setup hooks, resuming,
the epoch loop, validation hooks, reporting, checkpointing, stopping; a loop sees it through the
``RunOnWorker`` protocol. Adding a framework is one module in ``raymodel/backends/``: a ``Backend``, a
``WorkerLoop`` and a model base class; the drivers in ``train/``, ``tune/`` and ``serve/`` never ask which
backend they hold, only for the capability they need.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, ClassVar, Iterator, Mapping, Protocol, TypeVar

from raymodel._internal.deps import require
from raymodel.contract._generation import TextGeneration
from raymodel.contract._inference import Inference
from raymodel.contract._training import Training
from raymodel.data import DataSpec, kind_of
from raymodel.exceptions import DataError, ModelDefinitionError

if TYPE_CHECKING:
    import os

    from raymodel.hooks import HookRunner, RunContext

__all__ = [
    "DATA_KINDS",
    "UNRECORDED_NAN",
    "Backend",
    "PoolKind",
    "WarmUp",
    "WorkerLoop",
    "Model",
    "RunOnWorker",
]


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


@dataclasses.dataclass(frozen=True)
class PoolKind:
    """Where a backend's training jobs run on the training server: the pools of ``family`` (resident Ray
    Train worker groups that run jobs one after another; ``""``: the backend's own name; torch's family is
    Lightning's and transformers', the same trainer, process group and collective), and what a pool's
    worker imports while it waits for its first job (what a first set-up imports)."""

    family: str = ""
    worker_imports: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """What the training server's next job runner does ahead for a backend's jobs: ``runner_imports``
    past ``Backend.imports`` (what setting a model up imports), and ``runner_call`` (``"module:function"``)
    where the backend is warmed without a pool (``--warm rllib``: its Algorithm's actor)."""

    runner_imports: tuple[str, ...] = ()
    runner_call: str = ""


class Backend:
    """Base contract of a backend: the facts about a framework, its state, and its capabilities.

    Subclasses set the class attributes and implement every method that raises. Each capability is a part
    of its own, a class attribute: ``training`` (required: a ``RayTrain`` or an ``OwnRuns``), ``inference``
    (``Inference``'s defaults, or the framework's subclass), ``text`` (``None``: it generates no text),
    ``pool`` (``None``: never on a pool) and ``warm_up``.
    """

    #: Short name written into checkpoints ("torch", "xgboost", ...).
    name: ClassVar[str] = ""
    #: pip extra that installs the framework: ``pip install 'raymodel[<extra>]'``.
    extra: ClassVar[str] = ""
    #: Modules to import (checked before training; pickled by reference, never by value).
    imports: ClassVar[tuple[str, ...]] = ()
    #: How it trains: the worker loop, and a run as a Ray Train worker group (``RayTrain``) or of its own
    #: (``OwnRuns``). Every backend sets it.
    training: ClassVar[Training]
    #: How its models answer where the model's class defines no ``forward``, ``preprocess``, ...
    inference: ClassVar[Inference[Any]] = Inference()
    #: Its jobs' pools on the training server (by default its own kind); ``None``: its runs are no Ray Train
    #: worker group (``OwnRuns``), so never on a pool.
    pool: ClassVar[PoolKind | None] = PoolKind()
    #: What the training server's next job runner does ahead for its jobs.
    warm_up: ClassVar[WarmUp] = WarmUp()
    #: Distribution names whose versions are recorded in checkpoints.
    packages: ClassVar[tuple[str, ...]] = ()
    #: The data forms this backend trains on (a subset of ``DATA_KINDS``).
    accepts: ClassVar[tuple[str, ...]] = ("arrays",)
    #: Methods a user's subclass must define (checked before any Ray resource is taken).
    required_methods: ClassVar[tuple[str, ...]] = ("setup",)
    epoch_unit: ClassVar[str] = "epoch"  #: Name of the "epoch" unit in progress output.
    #: How this backend calls hooks, where it differs from "yes": hook name -> note.
    #: A note starting with "no" means the hook is never called (the docs' hook table reads this).
    hook_notes: ClassVar[Mapping[str, str]] = {}
    #: True when the precision, accumulation and clipping settings apply (torch, Lightning).
    gradient_steps: ClassVar[bool] = False
    #: True when ``TrainSettings(num_workers=(min, max))`` (an elastic run) works with this backend.
    elastic: ClassVar[bool] = False
    #: ``TrainSettings.strategy`` values this backend trains with (torch and Lightning add "fsdp"); empty for
    #: a backend whose run is one process that no strategy spreads (RLlib's learner): it stays the default.
    strategies: ClassVar[tuple[str, ...]] = ("ddp",)
    #: Keys of the state dict that ``write_state`` writes; any other (``on_save_checkpoint``'s) is saved beside.
    state_keys: ClassVar[tuple[str, ...]] = ()
    #: False when the model trains without ``data=`` (a reinforcement-learning env makes its own).
    needs_data: ClassVar[bool] = True
    #: ``(metric, mode)`` that ``tune`` optimizes without ``TuneSettings.metric`` (``None``: val_loss/loss, min).
    default_metric: ClassVar[tuple[str, str] | None] = None
    #: ``TrainSettings.method`` kinds it trains with besides supervised (``"grpo"``, ``"dpo"``: transformers').
    methods: ClassVar[tuple[str, ...]] = ()
    #: Its text generation (a causal LM's engine, its own requests, LoRA adapters); ``None``: it has none.
    text: ClassVar[TextGeneration[Any] | None] = None

    # ------------------------------------------------------------- checking
    def import_framework(self) -> None:
        """Import the framework, or raise ``MissingDependencyError`` naming the extra."""
        for module in self.imports:
            require(module, self.extra)

    @contextlib.contextmanager
    def isolated(self) -> Iterator[None]:
        """Around each job on a pool's worker: the framework's process-wide settings a job may change (threads,
        dtype, grad mode, ...) restored, and what it held freed, as on a fresh worker (a backend extends it)."""
        yield

    def calls(self, hook: str) -> bool:
        """Whether this backend ever calls ``hook`` during training."""
        return not self.hook_notes.get(hook, "yes").startswith("no")

    def validate_model(self, model: Model) -> None:
        """Raise ``ModelDefinitionError`` if the model lacks a required method."""
        base = next(k for k in reversed(type(model).__mro__) if "backend" in vars(k))  # e.g. RayTorchModel
        missing = [m for m in self.required_methods if getattr(type(model), m, None) is getattr(base, m, None)]
        if missing:
            names = ", ".join(f"`{m}`" for m in missing)
            raise ModelDefinitionError(
                f"`{type(model).__name__}` must define {names} to be trained with the "
                f"{self.name} backend. See the table 'What a subclass writes' in the docs' backends page."
            )

    def prepare_method_data(self, model: Model, data: Any, method: Any) -> Any:
        """``data`` as a ``DataSpec`` for a run of ``method`` (one of ``methods``), checked against the model
        (its rewards, the columns they take) before any Ray resource is taken."""
        raise NotImplementedError("The 'prepare_method_data' method must be implemented.")

    # ----------------------------------------------------------------- data
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

    def prepare_data(self, model: Model, data: Any) -> Any:
        """On the driver, before ``raymodel.data.resolve``: turn ``data`` into a form ``resolve`` takes.
        The identity by default; the transformers backend tokenizes Hugging Face datasets, frames and dicts
        of lists here, once per dataset. A ``DataSpec`` (already prepared) is passed through unchanged."""
        return data

    def check_split(self, name: str, split: Any) -> None:
        """Backend-specific checks of one accepted split (e.g. 2-D features); may raise ``DataError``."""

    def input_signature(self, model: Model, spec: DataSpec) -> dict[str, Any] | None:
        """The shape and dtype of what ``forward`` takes (``raymodel._internal.signature``), recorded in every
        checkpoint: the training data's by default."""
        return spec.signature

    def unrecorded_signature(self, model: Model) -> dict[str, Any] | None:
        """What a model with no recorded signature (untrained, or built in code) is checked against
        before ``forward``: what the model itself says of its input (a built Keras model's input shape,
        a booster's number of features), and the ``nonfinite`` policy of the framework (NaN is a
        missing value to a boosted tree, a silent NaN answer to a network). ``None``: no check."""
        return None

    # ------------------------------------------------------------- training
    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """Around the driver's ``prepare_data``: the framework's generators seeded (restored after): a model
        set up there (transformers': for its tokenizer) starts with the same weights for a seed."""
        yield

    # ---------------------------------------------------------------- state
    def after_user_setup(self, model: Model, returned: Any) -> None:
        """Called with what the user's ``setup`` returned (Lightning returns a module)."""

    def get_state(self, model: Model) -> dict[str, Any]:
        """The model's state as a dict of ``state_keys`` (``on_save_checkpoint`` may add entries)."""
        raise NotImplementedError("The 'get_state' method must be implemented.")

    def write_state(self, model: Model, state: dict[str, Any], directory: Path) -> None:
        """Write the ``state_keys`` entries of ``state`` into ``directory`` with the framework's own saver."""
        raise NotImplementedError("The 'write_state' method must be implemented.")

    def read_state(self, model: Model, directory: Path) -> dict[str, Any]:
        """Read what ``write_state`` wrote (the model is already set up)."""
        raise NotImplementedError("The 'read_state' method must be implemented.")

    def set_state(self, model: Model, state: dict[str, Any]) -> None:
        """Load ``state`` into the (set up) model; entries it has no use for are ignored."""
        raise NotImplementedError("The 'set_state' method must be implemented.")


class WorkerLoop:
    """What a backend does on a train worker; ``WorkerRun`` calls it and owns everything around it.

    A loop never calls the epoch-level hooks itself: ``WorkerRun`` does, in the one documented order. A loop
    calls only the batch hooks, through ``run.before_batch`` / ``run.after_batch``. A framework with its own
    fit loop (Lightning) overrides ``run_epochs`` and calls ``run.begin_epoch``, ``run.begin_validation``,
    ``run.end_validation`` and ``run.end_epoch`` from its callback points instead.
    """

    def __init__(self, run: RunOnWorker) -> None:
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

    async def score(self) -> dict[str, float]:
        """``validate``'s figures for the restored, untrained model (a release's gate); Lightning's own."""
        return await self.validate(0)

    def end_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        """After ``after_epoch``, before the checkpoint: per-epoch bookkeeping (e.g. LR schedulers)."""

    def batches_per_epoch(self) -> int | None:
        """This worker's training batches per epoch, when known (the progress bar's total)."""
        return None

    def step_rows(self) -> list[dict[str, float]]:
        """Each training step's figures so far, where the framework logs them per step (post-training's,
        TRL's): kept in the checkpoint (``TrainResult.steps``). Most loops report per epoch only."""
        return []

    async def run_epochs(self, first: int, last: int) -> None:
        """Run epochs ``first..last``, stopping early when ``run.epoch`` says so (``last`` may grow
        mid-run: ``job.update(settings={"num_epochs": ...})``; ``run.num_epochs`` is the current one)."""
        epoch = first
        while epoch <= self.run.num_epochs:
            if await self.run.epoch(epoch):
                return
            epoch += 1

    def apply_config(self, changes: dict[str, Any]) -> None:
        """``job.update``'s config changes, at an epoch boundary (``model.config`` holds them): set
        what the framework holds of them (an optimizer's learning rate, say)."""

    def settings_changed(self) -> None:
        """``run.settings`` changed at an epoch boundary: a framework's own copy (Lightning's max_epochs) follows."""

    # ---------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """The training state to checkpoint: the model's, plus optimizers and the like. Called on every worker
        when a checkpoint is due (a framework may save collectively); rank 0's is written."""
        return self.model.backend.get_state(self.model)

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore ``get_state``'s state on every worker (after ``build``)."""
        self.model.backend.set_state(self.model, state)

    def close(self) -> None:
        """After the run on this worker, done or failed: release what must not outlive it (a framework's
        network, say), so a pool's next job on this worker starts clean."""

    def all_gather(self, value: Any) -> list[Any]:
        """The framework's own all-gather of a small Python value (with ``RayTrain(collective=True)``)."""
        raise NotImplementedError("The 'all_gather' method must be implemented with `RayTrain(collective=True)`.")

    def rng_state(self) -> Any:
        """The framework's random generator state on this worker (``None``: nothing to save)."""
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore what ``rng_state`` returned."""


# ---------------------------------------------------------------- protocols
# What the drivers and the worker loops see of the objects above them (PEP 544): the drivers (train/,
# tune/, serve/, predict/, registry/, jobs/) type a model as `Model`, never importing `RayModel` (model.py
# sits above them); a backend's `WorkerLoop` sees its run as `RunOnWorker`, never importing `WorkerRun`.

T = TypeVar("T")


class Model(Protocol):
    """A raymodel model, as the drivers use it: ``RayModel``, every backend's subclass (and ModelHooks')."""

    @property
    def backend(self) -> Backend:
        """The framework seam of the model's backend (a class attribute of each backend's model class)."""
        ...

    #: ``default_config`` merged with the constructor's ``config``.
    config: dict[str, Any]
    #: Where the current weights came from (a checkpoint path or registry ref), if anywhere.
    source: dict[str, Any]
    #: The run this instance trains in; ``None`` outside a run.
    context: RunContext | None

    #: Whether ``setup`` has run on this instance (a driver that replaces ``config`` resets it).
    _is_setup: bool
    #: The input a training run recorded (``None``: untrained, or built in code).
    input_signature: dict[str, Any] | None

    @property
    def is_setup(self) -> bool: ...

    def ensure_setup(self) -> None: ...

    def setup(self, config: dict[str, Any]) -> Any: ...

    def forward(self, x: Any) -> Any: ...

    def preprocess(self, payload: Any) -> Any: ...

    def postprocess(self, output: Any) -> Any: ...

    def predict_batch_preprocess(self, batch: dict[str, Any]) -> Any: ...

    def predict_batch_postprocess(self, output: Any) -> dict[str, Any]: ...

    def hyperparameter_space(self) -> dict[str, Any]: ...

    def save(self, path: str | os.PathLike[str]) -> str: ...

    def load_weights(self, path: str | os.PathLike[str]) -> None: ...


class RunOnWorker(Protocol):
    """One training run on one worker, as a backend's ``WorkerLoop`` sees it (``train.WorkerRun``).

    A loop calls only the batch hooks and the phase methods; the run owns the
    lifecycle (the hook order, checkpoints, reports, the stop vote).
    """

    model: Model
    settings: Any  # the run's TrainSettings

    @property
    def num_epochs(self) -> int:
        """The last epoch (``job.update`` may change it)."""
        ...

    splits: dict[str, Any]
    rank: int
    world: int
    session: Any  # where the run is placed: a Ray Train worker or a Tune trial's process
    hooks: HookRunner
    progress: Any

    def sync(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` on the run's event loop from framework code in another thread."""
        ...

    async def before_batch(self, batch: Any, batch_idx: int) -> Any: ...

    async def after_batch(self, batch_idx: int, outputs: Any) -> None: ...

    async def epoch(self, epoch: int) -> bool:
        """One whole epoch (hooks, the loop's epoch, validation, report); True when the run stops."""
        ...

    async def begin_epoch(self, epoch: int) -> None: ...

    async def begin_validation(self) -> None: ...

    async def end_validation(self, metrics: dict[str, Any]) -> dict[str, float]: ...

    async def end_epoch(self, epoch: int, metrics: dict[str, Any]) -> bool: ...

    def all_gather(self, value: Any) -> list[Any]:
        """Every worker's ``value`` (small, picklable), by rank: a collective, every worker calls it."""
        ...

    def mean_over_workers(self, sums: dict[str, tuple[float, int]]) -> dict[str, float]:
        """``{name: (sum, count)}`` of this worker -> ``{name: mean}`` over every worker."""
        ...

    #: True when a resumed run's config differs from the checkpoint's (schedulers rebuild).
    config_changed: bool
