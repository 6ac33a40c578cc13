"""The worker side of ``RayTensorflowModel``: Keras ``fit`` and ``evaluate``, one epoch at a time.

Keras runs in a thread (``asyncio.to_thread``); its batch callbacks reach the
run's event loop through ``run.sync``. Rows follow raymodel's one sharding
policy (``raymodel.data.worker_rows``): the training permutation is drawn
per epoch from the seed, so a resumed run sees the same order as an
uninterrupted one.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from raymodel.contract import WorkerLoop
from raymodel.data import worker_rows

if TYPE_CHECKING:
    from raymodel.contract import RunOnWorker


class KerasLoop(WorkerLoop):
    #: The user's model: its networks, optimizers or booster are attributes that its ``setup`` and this loop set.
    model: Any

    def __init__(self, run: RunOnWorker) -> None:
        super().__init__(run)
        # On Ray Train workers (TF_CONFIG set by Ray): the multi-worker strategy; in a Tune trial: the default.
        self.strategy = _multi_worker_strategy(run) if run.session.in_worker_group else tf.distribute.get_strategy()
        self.valid: Any = None
        self.bridge: Any = None

    def setup_scope(self) -> contextlib.AbstractContextManager[Any]:
        return self.strategy.scope()

    def seed(self, seed: int) -> None:
        tf.keras.utils.set_random_seed(seed)

    def build(self) -> None:
        self.bridge = _BatchHooks(self.run)
        if self.has_validation:
            self.valid = self._dataset("valid", epoch=0)  # (dataset, steps)

    def set_state(self, state: dict[str, Any]) -> None:
        with self.strategy.scope():  # the optimizer's variables are created mirrored
            super().set_state(state)

    def apply_config(self, changes: dict[str, Any]) -> None:
        """The optimizer's learning rate (``lr`` or ``learning_rate``), a variable its compiled step
        reads; other keys are only in ``self.config`` (Keras compiles the rest into its step)."""
        optimizer = getattr(self.model.model, "optimizer", None)
        rate = changes.get("learning_rate", changes.get("lr"))
        if optimizer is not None and rate is not None:
            optimizer.learning_rate = float(rate)

    async def train_epoch(self, epoch: int) -> dict[str, float]:
        dataset, steps = self._dataset("train", epoch)
        logs = await asyncio.to_thread(
            self.model.model.fit,
            dataset,
            epochs=epoch,
            initial_epoch=epoch - 1,
            steps_per_epoch=steps,
            callbacks=[self.bridge],
            verbose=0,
        )
        return {k: float(v[-1]) for k, v in logs.history.items()}

    async def validate(self, epoch: int) -> dict[str, float]:
        dataset, steps = self.valid
        logs = await asyncio.to_thread(self.model.model.evaluate, dataset, steps=steps, return_dict=True, verbose=0)
        return {k: float(v) for k, v in logs.items()}

    def _dataset(self, split_name: str, epoch: int) -> tuple[Any, int]:
        """This worker's rows in per-worker batches of ``batch_size``, distributed as they are
        (``distribute_datasets_from_function``: TensorFlow neither re-batches nor re-shards them),
        and the steps that cover the longest shard (validation shards may differ by a row: the
        strategy gives a worker that ran out an empty batch, so every row counts once)."""
        run, s = self.run, self.run.settings
        split = run.splits[split_name]
        idx = worker_rows(
            len(split), run.rank, run.world, train=split_name == "train", shuffle=s.shuffle, seed=s.seed, epoch=epoch
        )
        x = np.asarray(split.x)[idx]
        if np.issubdtype(x.dtype, np.floating):
            x = x.astype(np.float32)
        tensors = x if split.y is None else (x, np.asarray(split.y)[idx])

        def local(_: Any) -> Any:
            return tf.data.Dataset.from_tensor_slices(tensors).batch(s.batch_size)

        longest = -(-len(split) // run.world)
        return self.strategy.distribute_datasets_from_function(local), -(-longest // s.batch_size)


class _BatchHooks(tf.keras.callbacks.Callback):
    """Keras' batch callback points -> the run's batch hooks."""

    def __init__(self, run: RunOnWorker) -> None:
        super().__init__()
        self.run = run

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.run.hooks.has("before_batch"):
            self.run.sync(self.run.before_batch(None, batch))

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.run.hooks.has("after_batch") or self.run.progress is not None:
            self.run.sync(self.run.after_batch(batch, dict(logs or {})))


_STRATEGY: list[Any] = []


def _multi_worker_strategy(run: RunOnWorker) -> Any:
    """The worker's ``MultiWorkerMirroredStrategy``: TensorFlow sets up its collective once per
    process, so the jobs of a pool (same workers, same ``TF_CONFIG``) share the first one."""
    if not getattr(run.session, "pooled", False):
        return tf.distribute.MultiWorkerMirroredStrategy()
    if not _STRATEGY:
        _STRATEGY.append(tf.distribute.MultiWorkerMirroredStrategy())
    return _STRATEGY[0]
