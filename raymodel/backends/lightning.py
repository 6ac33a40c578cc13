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
import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

from raymodel._internal.deps import require
from raymodel.backends.base import Backend, to_jsonable
from raymodel.exceptions import ModelDefinitionError
from raymodel.model import RayModel


def _lightning() -> Any:
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = require("pytorch_lightning", "lightning")
    return pl


class LightningBackend(Backend):
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

    def make_trainer(self, train_loop: Callable[[dict[str, Any]], Any], *, train_loop_config: dict[str, Any],
                     scaling_config: Any, run_config: Any, datasets: dict[str, Any] | None) -> Any:
        from ray.train.torch import TorchTrainer

        return TorchTrainer(train_loop, train_loop_config=train_loop_config, scaling_config=scaling_config,
                            run_config=run_config, datasets=datasets or None)

    def after_user_setup(self, model: RayModel, returned: Any) -> None:
        pl = _lightning()
        if returned is not None:
            model.module = returned
        if not isinstance(getattr(model, "module", None), pl.LightningModule):
            raise ModelDefinitionError(
                f"`{type(model).__name__}.setup` must return a `LightningModule` (or assign `self.module`); "
                f"got {type(getattr(model, 'module', returned)).__name__}."
            )

    def get_state(self, model: RayModel) -> dict[str, Any]:
        return {"module": model.module.state_dict()}

    def write_state(self, model: RayModel, state: dict[str, Any], directory: Path) -> None:
        import torch

        torch.save(state, directory / "module.pt")

    def read_state(self, model: RayModel, directory: Path) -> dict[str, Any]:
        import torch

        return torch.load(directory / "module.pt", map_location="cpu", weights_only=False)

    def set_state(self, model: RayModel, state: dict[str, Any]) -> None:
        model.module.load_state_dict(state["module"])

    def forward(self, model: RayModel, x: Any) -> Any:
        return model.module(x)

    def preprocess(self, model: RayModel, payload: Any) -> Any:
        import numpy as np
        import torch

        return torch.as_tensor(np.asarray(payload, dtype=np.float32))

    def postprocess(self, model: RayModel, output: Any) -> Any:
        return to_jsonable(output)

    @contextlib.contextmanager
    def inference(self, model: RayModel) -> Iterator[None]:
        import torch

        was_training = model.module.training
        model.module.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            model.module.train(was_training)

    def stack(self, inputs: Any) -> Any:
        import torch

        if all(isinstance(x, torch.Tensor) for x in inputs):
            return torch.cat(list(inputs), dim=0)
        return super().stack(inputs)


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
