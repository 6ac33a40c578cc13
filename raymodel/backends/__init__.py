"""The built-in framework plug-ins. Each registers its model base class in the backend table
(``raymodel.contract``) when its module is imported, and imports its framework only when used.

| class | trains on |
| --- | --- |
| ``RayTorchModel`` | ``TorchTrainer``, DDP |
| ``RayLightningModel`` | ``TorchTrainer`` + Lightning ``Trainer`` with Ray's DDP strategy |
| ``RayTensorflowModel`` | ``TensorflowTrainer``, ``MultiWorkerMirroredStrategy`` |
| ``RayXGBoostModel`` | Ray Train's ``XGBoostTrainer`` |
| ``RayLightGBMModel`` | Ray Train's ``LightGBMTrainer`` |
| ``RayRLlibModel`` | an RLlib Algorithm (new API stack) in an actor of raymodel's |
| ``RayTransformersModel`` | ``TorchTrainer`` + Hugging Face's ``Trainer`` |

A plug-in is one subpackage here (its ``Backend``, ``WorkerLoop`` and model base
class in its ``__init__``, its private modules beside them); the plug-ins do not
import each other (import-linter's independence contract in ``pyproject.toml``)
but for the ones built on torch (Lightning, RLlib, transformers), which use ``torch/``'s
backend and loop; the boosters share ``_trees.py``. ``import raymodel`` imports this package, so every built-in
backend is in the table of every process.
"""

from raymodel.backends import lightgbm, lightning, rllib, tensorflow, torch, transformers, xgboost
from raymodel.contract import Backend, WorkerLoop

__all__ = ["Backend", "WorkerLoop", "lightgbm", "lightning", "rllib", "tensorflow", "torch", "transformers", "xgboost"]
