"""Per-framework backends. Each module imports its framework only when used.

| class | trains on |
| --- | --- |
| ``RayTorchModel`` | ``TorchTrainer``, DDP |
| ``RayLightningModel`` | ``TorchTrainer`` + Lightning ``Trainer`` with Ray's DDP strategy |
| ``RayTensorflowModel`` | ``TensorflowTrainer``, ``MultiWorkerMirroredStrategy`` |
| ``RayXGBoostModel`` | Ray Train's ``XGBoostTrainer`` |
| ``RayLightGBMModel`` | Ray Train's ``LightGBMTrainer`` |
"""

from raymodel.backends.base import Backend

__all__ = ["Backend"]
