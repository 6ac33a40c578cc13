"""The hooks: one list, one order, declared once as documented no-ops.

A model overrides any of them; a ``Callback`` passed in
``TrainSettings(callbacks=[...])`` receives the same training calls (its
``self.model`` is the model instance it observes). Any hook may be
``async def``.

Order of a training run on each train worker (epochs count from 1)::

    before_setup, after_setup,              # around the user's setup(config)
    [on_load_checkpoint(state)]             # when resuming (the newest complete checkpoint), or starting
                                            # from the instance's weights (it was trained, loaded or set up:
                                            # a transformers model is set up on the driver, for its tokenizer)
    before_fit,
    for each epoch:
        before_epoch(epoch),
        for each batch:  before_batch(batch, i) -> batch,  after_batch(i, outputs)
        before_validation, after_validation(metrics)        # when there is a validation split
        after_epoch(epoch, metrics),
        [on_save_checkpoint(state)]         # every `checkpoint_every` epochs and after the last
    after_fit(result)

On the driver, after ``train()`` / ``tune()`` returns and wherever a
checkpoint is loaded (``from_checkpoint``, the registry, a serve replica):
``before_setup, after_setup, on_load_checkpoint(state)``. A serve replica and
``predict`` call ``preprocess(payload)`` and ``postprocess(output)`` around
``forward``; ``predict_batch`` calls ``predict_batch_preprocess(batch)`` and
``predict_batch_postprocess(output)`` around it, once per Ray Data batch.

One class carries out this order for every backend: ``WorkerRun`` in
``raymodel/train/_worker_run.py``. A backend supplies only the work inside it
(build, one epoch, validation, state) and declares in ``Backend.hook_notes`` which
hooks it calls (boosted trees have boosting rounds for epochs and no batches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from raymodel.hooks._context import RunContext

F = TypeVar("F", bound=Callable[..., Any])

#: Every hook, in the order a training run calls them.
HOOK_NAMES: tuple[str, ...] = (
    "before_setup",
    "after_setup",
    "before_fit",
    "before_epoch",
    "before_batch",
    "after_batch",
    "before_validation",
    "after_validation",
    "after_epoch",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "on_config_update",
    "after_fit",
    "preprocess",
    "postprocess",
    "predict_batch_preprocess",
    "predict_batch_postprocess",
)

#: Hooks a ``Callback`` receives (the data transforms from ``preprocess`` on stay the model's).
CALLBACK_HOOK_NAMES: tuple[str, ...] = HOOK_NAMES[: HOOK_NAMES.index("preprocess")]


def default(fn: F) -> F:
    """Mark a hook implementation as the no-op default, so dispatch can skip it."""
    fn._raymodel_default = True  # type: ignore[attr-defined]
    return fn


def is_default(obj: Any, name: str) -> bool:
    """True when ``obj.name`` is still the no-op default (the user did not override it)."""
    fn = getattr(type(obj), name, None)
    return fn is None or getattr(fn, "_raymodel_default", False)


class TrainingHooks:
    """The training hooks shared by models and callbacks. All are no-ops by default."""

    @default
    def before_setup(self) -> None:
        """Called before the model's ``setup(config)``, wherever the model is built:
        a train worker, a serve replica, or the driver when weights are loaded."""

    @default
    def after_setup(self) -> None:
        """Called right after ``setup(config)`` returned, in the same process."""

    @default
    def before_fit(self) -> None:
        """Called on every train worker once the model, optimizers and data are ready,
        before the first epoch."""

    @default
    def before_epoch(self, epoch: int) -> None:
        """Called on every train worker at the start of epoch ``epoch`` (1-based)."""

    @default
    def before_batch(self, batch: Any, batch_idx: int) -> Any:
        """Called on every train worker before ``train_step``. Return the batch to use
        (``None`` keeps it unchanged): a place to augment or move data."""
        return batch

    @default
    def after_batch(self, batch_idx: int, outputs: Any) -> None:
        """Called on every train worker after the optimizer step, with what
        ``train_step`` returned."""

    @default
    def before_validation(self) -> None:
        """Called on every train worker before the validation pass of an epoch
        (only when there is a validation split)."""

    @default
    def after_validation(self, metrics: dict[str, float]) -> None:
        """Called on every train worker with the validation metrics, already
        averaged over the whole validation split across workers."""

    @default
    def after_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        """Called on every train worker at the end of epoch ``epoch`` with the epoch's
        metrics (``loss`` averaged over all workers, plus validation metrics)."""

    @default
    def on_save_checkpoint(self, state: dict[str, Any]) -> None:
        """Called on train worker rank 0 before a checkpoint is written; ``state`` is the
        dict the backend is about to save. Add entries to it to save them too."""

    @default
    def on_load_checkpoint(self, state: dict[str, Any]) -> None:
        """Called after the backend restored its state from a checkpoint (driver,
        train worker on restart, serve replica); ``state`` holds what was saved."""

    @default
    def on_config_update(self, changes: dict[str, Any]) -> None:
        """Called on every train worker at an epoch boundary when ``job.update(config=...)`` changed
        the config, with the changed keys; from the next epoch on. ``self.config`` already holds
        them, and the backend has set what it can (torch: the optimizers' ``lr``, ``weight_decay``,
        ``momentum``, ``betas``, ``eps``). Called again, with every change so far, when a run resumes
        from a checkpoint written after a change."""

    @default
    def after_fit(self, result: dict[str, Any]) -> None:
        """Called on every train worker after the last epoch, with
        ``{"metrics": last epoch's metrics, "history": [...]}``."""


class ModelHooks(TrainingHooks):
    """Every hook of a model: the training hooks plus the serving transforms."""

    def preprocess(self, payload: Any) -> Any:
        """Turn a request payload (decoded JSON) into one model input.

        Runs in ``predict`` and on every serve replica, once per request. Raise
        ``ValueError``, ``TypeError`` or ``KeyError`` for a payload you reject: the
        server answers 422 with your message. The default lives in each backend.
        """
        return payload

    def postprocess(self, output: Any) -> Any:
        """Turn the model output for one request into a JSON-serializable answer.

        Runs in ``predict`` and on every serve replica, once per request.
        """
        return output

    def predict_batch_preprocess(self, batch: dict[str, Any]) -> Any:
        """Turn one Ray Data batch (``{column: numpy array}``) into one model input.

        Runs in ``predict_batch``'s actors, once per batch, with the feature
        columns only (read-only views of Ray Data's block: copy before writing).
        The default (in each backend) puts the columns side by side as one
        float32 array of rows (a tensor for torch).
        """
        return batch

    def predict_batch_postprocess(self, output: Any) -> dict[str, Any]:
        """Turn ``forward``'s output for one batch into output columns ``{name: array}``,
        each with one entry per input row, in the input's order.

        The default (in each backend) is ``{"prediction": output}`` as numpy; a
        dict output gives one column per key.
        """
        return output


class Callback(TrainingHooks):
    """Receives the training hooks of a run; pass instances in ``TrainSettings(callbacks=...)``.

    A callback is pickled and runs on every train worker; ``self.model`` is the
    model instance of that worker and ``self.context`` the ``RunContext``
    (rank, epoch, ``should_stop``, ...). Override any ``before_*`` / ``after_*`` /
    ``on_*_checkpoint`` method; ``async def`` works too. A callback that keeps
    state across epochs returns it from ``state_dict``: it is saved in every
    checkpoint and handed back to ``load_state_dict`` when a run resumes.

    Example:
        >>> class PrintLoss(rm.Callback):
        ...     def after_epoch(self, epoch, metrics):
        ...         print(epoch, metrics["loss"])
    """

    model: Any = None
    #: The run's ``RunContext``, set on each worker before the first hook is called.
    context: RunContext

    def state_dict(self) -> dict[str, Any]:
        """What to save in each checkpoint (picklable); ``{}`` by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned, when a run resumes from a checkpoint."""
