"""Offline batch inference over Ray Data: ``model.predict_batch(data)``, ``rm.predict_batch(ref, data)``.

The same class that trains and serves scores a data set: a pool of Ray Data
actors each loads the model once and runs ``predict_batch_preprocess ->
forward -> predict_batch_postprocess`` on each batch; the result is a lazy
``ray.data.Dataset`` whose rows follow the input's order.
"""

from raymodel.predict._batch import DEFAULT_BATCH_SIZE, Predictions, predict_batch

__all__ = ["DEFAULT_BATCH_SIZE", "Predictions", "predict_batch"]
