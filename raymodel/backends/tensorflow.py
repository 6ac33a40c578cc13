"""TensorFlow/Keras: ``RayTensorflowModel`` on Ray Train's ``TensorflowTrainer``.

Each worker builds the model inside ``MultiWorkerMirroredStrategy().scope()``
and runs Keras ``fit`` one epoch at a time over its own shard of the rows;
gradients are all-reduced by the strategy. An epoch is a Keras epoch.

Hooks, mapped from Keras callbacks: ``before_setup``, ``after_setup``,
``[on_load_checkpoint]``, ``before_fit`` (``on_train_begin``),
``before_epoch`` (``on_epoch_begin``), ``before_batch``
(``on_train_batch_begin``; its return value is ignored), ``after_batch``
(``on_train_batch_end``, with Keras' logs), ``before_validation`` /
``after_validation`` (``on_test_begin`` / ``on_test_end``), ``after_epoch``
(``on_epoch_end``), ``[on_save_checkpoint]``, ``after_fit``. ``loss`` and
the compiled metrics are Keras' epoch logs (already averaged across workers
by the strategy); validation ones carry Keras' ``val_`` prefix.
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from raymodel._internal import serialization
from raymodel._internal.deps import require
from raymodel.backends.base import Backend, to_jsonable
from raymodel.data import Arrays, DataSpec
from raymodel.exceptions import DataError, ModelDefinitionError
from raymodel.model import RayModel

WEIGHTS_FILE = "model.weights.h5"

# Keras 3 does not support `MultiWorkerMirroredStrategy` (keras-team/keras#20585,
# ray-project/ray#47464), so `tf.keras` must be Keras 2 (the `tf-keras` package)
# in every process that builds these models: set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
if "tensorflow" in sys.modules and os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    warnings.warn("TensorFlow was imported before raymodel's tensorflow backend; `tf.keras` may be Keras 3, "
                  "which cannot train with MultiWorkerMirroredStrategy. Import raymodel first.", RuntimeWarning,
                  stacklevel=2)


class TensorflowBackend(Backend):
    name = "tensorflow"
    extra = "tensorflow"
    packages = ("tensorflow", "keras")
    required_methods = ("setup",)

    @classmethod
    def model_base(cls) -> type:
        return RayTensorflowModel

    def import_framework(self) -> None:
        require("tensorflow", "tensorflow")
        require("tf_keras", "tensorflow")

    def validate_data(self, data: DataSpec) -> None:
        bad = [name for name, split in data.splits.items() if not isinstance(split, Arrays)]
        if bad:
            raise DataError(f"The tensorflow backend trains on arrays: pass `rm.data.from_numpy(X, y)` or "
                            f"`(X, y)` tuples (split {bad[0]!r} is not).")

    def train_loop(self) -> Callable[[dict[str, Any]], Any]:
        return tensorflow_train_loop

    def make_trainer(self, train_loop: Callable[[dict[str, Any]], Any], *, train_loop_config: dict[str, Any],
                     scaling_config: Any, run_config: Any, datasets: dict[str, Any] | None) -> Any:
        from ray.train.tensorflow import TensorflowTrainer

        # Ray's TensorFlow backend imports TensorFlow in each worker before our loop runs.
        env = dict(run_config.worker_runtime_env or {})
        env["env_vars"] = {"TF_CPP_MIN_LOG_LEVEL": os.environ["TF_CPP_MIN_LOG_LEVEL"],
                           **env.get("env_vars", {}), "TF_USE_LEGACY_KERAS": "1"}
        run_config.worker_runtime_env = env
        return TensorflowTrainer(train_loop, train_loop_config=train_loop_config, scaling_config=scaling_config,
                                 run_config=run_config, datasets=datasets or None)

    def after_user_setup(self, model: RayModel, returned: Any) -> None:
        if returned is not None and getattr(model, "model", None) is None:
            model.model = returned
        keras_model = getattr(model, "model", None)
        if keras_model is None or not hasattr(keras_model, "fit"):
            raise ModelDefinitionError(f"`{type(model).__name__}.setup` must build and compile a Keras model "
                                       "into `self.model`.")

    def get_state(self, model: RayModel) -> dict[str, Any]:
        return {"weights": [np.array(w) for w in model.model.get_weights()]}

    def write_state(self, model: RayModel, state: dict[str, Any], directory: Path) -> None:
        state = dict(state)
        holder = _plain_copy(model.model)
        holder.set_weights(state.pop("weights"))
        holder.save_weights(str(directory / WEIGHTS_FILE))  # Keras' own format
        if state:
            (directory / "extra.pkl").write_bytes(serialization.dumps(state))

    def read_state(self, model: RayModel, directory: Path) -> dict[str, Any]:
        holder = _plain_copy(model.model)
        holder.load_weights(str(directory / WEIGHTS_FILE))
        state: dict[str, Any] = {"weights": holder.get_weights()}
        if (directory / "extra.pkl").exists():
            state.update(serialization.loads((directory / "extra.pkl").read_bytes()))
        return state

    def set_state(self, model: RayModel, state: dict[str, Any]) -> None:
        model.model.set_weights(state["weights"])

    def forward(self, model: RayModel, x: Any) -> Any:
        return model.model(x, training=False)

    def postprocess(self, model: RayModel, output: Any) -> Any:
        return to_jsonable(output)


class RayTensorflowModel(RayModel):
    """A Keras model trained with ``MultiWorkerMirroredStrategy`` on Ray Train workers.

    ``setup(config)`` builds and compiles the model into ``self.model`` with
    ``tf.keras`` (it runs inside the strategy's scope on the workers).
    ``forward`` defaults to ``self.model(x)``. ``tf.keras`` is Keras 2 (the
    ``tf-keras`` package) here: Keras 3 cannot train with
    ``MultiWorkerMirroredStrategy`` (keras-team/keras#20585).

    Example:
        >>> class Iris(rm.RayTensorflowModel):
        ...     def setup(self, config):
        ...         import tensorflow as tf
        ...         keras = tf.keras
        ...         self.model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        ...         self.model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    """

    backend = TensorflowBackend()
    model: Any = None


def _plain_copy(keras_model: Any) -> Any:
    """The same architecture outside any distribution strategy, to save or load weights.

    Under ``MultiWorkerMirroredStrategy`` reading some variables (metrics) is a
    collective, so rank 0 alone must not save the live model: it saves a copy.
    Subclassed models cannot be cloned; they are saved directly.
    """
    import tensorflow as tf

    try:
        return tf.keras.models.clone_model(keras_model)
    except Exception:  # noqa: BLE001 - subclassed models
        return keras_model


def tensorflow_train_loop(loop_config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker``: Keras ``fit`` one epoch at a time under the strategy."""
    import tensorflow as tf

    from raymodel.backends._session import WorkerRun

    loop = asyncio.new_event_loop()
    wait = loop.run_until_complete
    run = WorkerRun(loop_config)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.keras.utils.set_random_seed(run.settings.seed)
    with strategy.scope():
        wait(run.setup_model())
    wait(run.restore())
    splits = run.splits()
    batch = run.settings.batch_size
    train = _dataset(tf, splits["train"], batch, run, train=True)
    valid = _dataset(tf, splits["valid"], batch, run, train=False) if "valid" in splits else None
    bridge = _bridge(tf, run, wait)
    wait(run.hooks.call("before_fit"))
    for epoch in run.epochs():
        bridge.epoch = epoch
        logs = run.model.model.fit(train, validation_data=valid, epochs=epoch, initial_epoch=epoch - 1,
                                   callbacks=[bridge], verbose=0)
        metrics = {k: float(v[-1]) for k, v in logs.history.items()}
        wait(run.hooks.call("after_epoch", epoch, metrics))
        wait(run.end_epoch(epoch, metrics))
    result = wait(run.finish())
    loop.close()
    return result


def _dataset(tf: Any, split: Arrays, batch: int, run: Any, train: bool) -> Any:
    """This worker's shard; the strategy splits each global batch (``batch * world``) across workers."""
    from raymodel.data import shard_indices

    idx = shard_indices(len(split), run.rank, run.world, shuffle=train, seed=run.settings.seed, epoch=0, pad=True)
    x = np.asarray(split.x)[idx]
    y = None if split.y is None else np.asarray(split.y)[idx]
    if np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices(x if y is None else (x, y))
    if train and run.settings.shuffle:
        ds = ds.shuffle(len(x), seed=run.settings.seed, reshuffle_each_iteration=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.batch(batch * run.world).with_options(options)


def _bridge(tf: Any, run: Any, wait: Callable[[Any], Any]) -> Any:
    hooks = run.hooks

    class HookBridge(tf.keras.callbacks.Callback):
        epoch = 1

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            wait(hooks.call("before_epoch", self.epoch))

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if hooks.has("before_batch"):
                wait(hooks.before_batch(None, batch))

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if hooks.has("after_batch"):
                wait(hooks.call("after_batch", batch, dict(logs or {})))

        def on_test_begin(self, logs: Any = None) -> None:
            wait(hooks.call("before_validation"))

        def on_test_end(self, logs: Any = None) -> None:
            wait(hooks.call("after_validation", {f"val_{k}": float(v) for k, v in (logs or {}).items()}))

    return HookBridge()
