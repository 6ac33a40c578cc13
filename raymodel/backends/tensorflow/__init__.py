"""TensorFlow/Keras: ``RayTensorflowModel`` on Ray Train's ``TensorflowTrainer``.

Each worker builds the model inside ``MultiWorkerMirroredStrategy().scope()``
and runs Keras ``fit`` one epoch at a time over its own shard of the rows,
then Keras ``evaluate`` on its shard of the validation rows; gradients and
metrics are all-reduced by the strategy. An epoch is a Keras epoch.

Hooks: ``WorkerRun`` calls every epoch-level hook; ``before_batch`` and
``after_batch`` come from Keras' ``on_train_batch_begin``/``_end`` (the first
gets ``None`` and its return value is ignored; the second gets Keras' batch
logs). ``loss`` and the compiled metrics are Keras' epoch logs, validation
ones with a ``val_`` prefix. A checkpoint holds the weights (Keras' own
``.weights.h5``) and the optimizer's variables, so a resumed run continues
with the same optimizer state.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from raymodel.contract import UNRECORDED_NAN, Backend, Inference, PoolKind, RayTrain
from raymodel.exceptions import ModelDefinitionError
from raymodel.model import RayModel

WEIGHTS_FILE = "model.weights.h5"
OPTIMIZER_FILE = "optimizer.npz"

# Keras 3 does not support `MultiWorkerMirroredStrategy` (keras-team/keras#20585,
# ray-project/ray#47464), so `tf.keras` must be Keras 2 (the `tf-keras` package)
# in every process that builds these models: set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter


class KerasTraining(RayTrain):
    """``TensorflowTrainer``'s worker groups, each worker with Keras 2 (``TF_USE_LEGACY_KERAS``)."""

    def worker_env(self, env_vars: dict[str, str]) -> dict[str, str]:
        """Ray's TensorFlow backend imports TensorFlow in each worker before the loop runs: Keras 2 is
        chosen there, and TensorFlow's C++ start-up kept quiet unless the run says otherwise."""
        return {"TF_CPP_MIN_LOG_LEVEL": os.environ["TF_CPP_MIN_LOG_LEVEL"], **env_vars, "TF_USE_LEGACY_KERAS": "1"}


class KerasInference(Inference[Any]):
    """A Keras model's answers: ``self.model(x)``, not in training mode."""

    def forward(self, model: Any, x: Any) -> Any:
        return model.model(x, training=False)


class TensorflowBackend(Backend):
    name = "tensorflow"
    extra = "tensorflow"
    imports = ("tensorflow", "tf_keras")
    pool = PoolKind(worker_imports=("raymodel.backends.tensorflow._loop",))
    packages = ("tensorflow", "keras", "tf-keras")
    training = KerasTraining("raymodel.backends.tensorflow._loop:KerasLoop", "ray.train.tensorflow.TensorflowTrainer")
    inference = KerasInference()
    accepts = ("arrays",)
    required_methods = ("setup",)
    hook_notes = {"before_batch": "yes (gets `None`, return ignored)", "after_batch": "yes (Keras' batch logs)"}
    state_keys = ("weights", "optimizer")

    def import_framework(self) -> None:
        super().import_framework()
        import tensorflow as tf

        if not str(getattr(tf.keras, "__version__", "2.")).startswith("2."):
            warnings.warn(
                "`tf.keras` is Keras 3 here, which cannot train with MultiWorkerMirroredStrategy: "
                "TensorFlow was imported before raymodel. Import raymodel first.",
                RuntimeWarning,
                stacklevel=3,
            )

    @contextlib.contextmanager
    def isolated(self) -> Iterator[None]:
        """Keras' global state (its graph, layer name counters) cleared after each job on a pool."""
        try:
            yield
        finally:
            import tensorflow as tf

            tf.keras.backend.clear_session()

    def after_user_setup(self, model: Any, returned: Any) -> None:
        if returned is not None and getattr(model, "model", None) is None:
            model.model = returned
        keras_model = getattr(model, "model", None)
        if keras_model is None or not hasattr(keras_model, "fit"):
            raise ModelDefinitionError(
                f"`{type(model).__name__}.setup` must build and compile a Keras model into `self.model`."
            )

    def get_state(self, model: Any) -> dict[str, Any]:
        """The weights, and the optimizer's variables once it has any."""
        state: dict[str, Any] = {"weights": [np.array(w) for w in model.model.get_weights()]}
        optimizer = getattr(model.model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "_built", False):
            state["optimizer"] = [np.array(v) for v in optimizer.variables]
        return state

    def write_state(self, model: Any, state: dict[str, Any], directory: Path) -> None:
        holder = _plain_copy(model.model)
        holder.set_weights(state["weights"])
        holder.save_weights(str(directory / WEIGHTS_FILE))  # Keras' own format
        if "optimizer" in state:
            np.savez(directory / OPTIMIZER_FILE, *state["optimizer"])

    def read_state(self, model: Any, directory: Path) -> dict[str, Any]:
        holder = _plain_copy(model.model)
        holder.load_weights(str(directory / WEIGHTS_FILE))
        state: dict[str, Any] = {"weights": holder.get_weights()}
        if (directory / OPTIMIZER_FILE).is_file():
            with np.load(directory / OPTIMIZER_FILE) as saved:
                state["optimizer"] = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        return state

    def set_state(self, model: Any, state: dict[str, Any]) -> None:
        model.model.set_weights(state["weights"])
        optimizer = getattr(model.model, "optimizer", None)
        if state.get("optimizer") and optimizer is not None and hasattr(optimizer, "set_weights"):
            optimizer.build(model.model.trainable_variables)
            optimizer.set_weights(state["optimizer"])

    def unrecorded_signature(self, model: Any) -> dict[str, Any] | None:
        """A built Keras model's input shape (``None``: any length); NaN is refused (a silent NaN answer)."""
        keras_model: Any = getattr(model, "model", None)
        try:
            shape = keras_model.input_shape if getattr(keras_model, "built", False) else None
        except (AttributeError, ValueError):  # a subclassed model, or one of several inputs
            shape = None
        if isinstance(shape, tuple) and all(n is None or isinstance(n, int) for n in shape):
            return {"shape": list(shape[1:]), "nonfinite": "error", "why": UNRECORDED_NAN}
        return {"nonfinite": "error", "why": UNRECORDED_NAN}


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
