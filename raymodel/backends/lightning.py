"""PyTorch Lightning: ``RayLightningModel`` on ``TorchTrainer`` + Lightning's ``Trainer``.

Each worker runs ``Trainer.fit`` with Ray's ``RayDDPStrategy`` and
``RayLightningEnvironment`` (through ``ray.train.lightning.prepare_trainer``);
an epoch is a Lightning epoch. The module's own ``training_step``,
``validation_step`` and ``configure_optimizers`` are used unchanged.

Hooks, mapped from Lightning's callback hooks: ``before_setup``,
``after_setup``, ``[on_load_checkpoint]``, ``before_fit`` (``on_train_start``),
``before_epoch`` (``on_train_epoch_start``), ``before_batch``
(``on_train_batch_start``; its return value is ignored: change batches in the
module's ``on_before_batch_transfer``), ``after_batch``
(``on_train_batch_end``), ``before_validation`` / ``after_validation``
(``on_validation_start`` / ``on_validation_end``), ``after_epoch``
(``on_train_epoch_end``, after validation, as in Lightning),
``[on_save_checkpoint]``, ``after_fit``. ``loss`` is the mean of the
training step's loss over every worker's batches; logged metrics
(``self.log(..., sync_dist=True)``) are reported as they are named.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from raymodel._internal.deps import require
from raymodel.backends.torch import TorchBackend
from raymodel.exceptions import ModelDefinitionError
from raymodel.model import RayModel


def _lightning() -> Any:
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = require("pytorch_lightning", "lightning")
    return pl


class LightningBackend(TorchBackend):
    """The torch backend's state and inference (the module is ``self.module``), Lightning's loop."""

    name = "lightning"
    extra = "lightning"
    packages = ("torch", "pytorch-lightning", "lightning")
    required_methods = ("setup",)

    @classmethod
    def model_base(cls) -> type:
        return RayLightningModel

    def import_framework(self) -> None:
        require("torch", "lightning")
        _lightning()

    def train_loop(self) -> Callable[[dict[str, Any]], Any]:
        return lightning_train_loop

    def after_user_setup(self, model: RayModel, returned: Any) -> None:
        pl = _lightning()
        if returned is not None:
            model.module = returned
        if not isinstance(getattr(model, "module", None), pl.LightningModule):
            raise ModelDefinitionError(
                f"`{type(model).__name__}.setup` must return a `LightningModule` (or assign `self.module`); "
                f"got {type(getattr(model, 'module', returned)).__name__}."
            )

    def forward(self, model: RayModel, x: Any) -> Any:
        return model.module(x)


class RayLightningModel(RayModel):
    """A ``LightningModule`` trained with Lightning's ``Trainer`` on Ray Train workers.

    ``setup(config)`` returns the module (or assigns ``self.module``); nothing
    else is needed. ``forward`` defaults to the module's.

    Example:
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> class Boring(rm.RayLightningModel):
        ...     def setup(self, config):
        ...         return BoringModel()
    """

    backend = LightningBackend()
    module: Any = None


def lightning_train_loop(loop_config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker``: ``Trainer.fit`` with Ray's DDP strategy."""
    from raymodel.backends._lightning_loop import fit

    return asyncio.run(fit(loop_config))
