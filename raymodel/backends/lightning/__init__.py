"""PyTorch Lightning: ``RayLightningModel`` on ``TorchTrainer`` + Lightning's ``Trainer``.

Each worker runs ``Trainer.fit`` with Ray's ``RayDDPStrategy`` (``RayFSDPStrategy`` with ``strategy="fsdp"``) and
``RayLightningEnvironment`` (checked by ``ray.train.lightning.prepare_trainer``);
an epoch is a Lightning epoch. The module's own ``training_step``,
``validation_step`` and ``configure_optimizers`` are used unchanged.
Lightning's callback points drive raymodel's lifecycle (``WorkerRun``):
``on_train_epoch_start`` begins an epoch, ``on_validation_start``/``_end``
bracket validation, ``on_train_epoch_end`` ends the epoch (after validation,
as in Lightning). ``before_batch`` is called from ``on_train_batch_start``
(its return value is ignored: change batches in the module's
``on_before_batch_transfer``). ``loss`` is the mean of the training step's
loss over every worker's batches; logged metrics (``self.log(...,
sync_dist=True)``) are reported as they are named.

A checkpoint holds Lightning's own checkpoint (``Trainer.save_checkpoint``:
weights, optimizers, LR schedulers, loops, callbacks, precision), and a run
resumes with ``Trainer.fit(ckpt_path=...)``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from raymodel._internal.deps import require
from raymodel.backends.lightning._import import lightning as _lightning
from raymodel.backends.torch.backend import TorchBackend, TorchInference
from raymodel.contract import Model, PoolKind
from raymodel.exceptions import ModelDefinitionError
from raymodel.model import RayModel


class LightningInference(TorchInference):
    """The torch backend's inference; ``forward`` is the module's (``self.module``)."""


class LightningBackend(TorchBackend):
    """The torch backend's runs with Lightning's loop, its inference (the module is ``self.module``),
    Lightning's checkpoint."""

    name = "lightning"
    extra = "lightning"
    imports = ("torch", "pytorch_lightning", "lightning")
    pool = PoolKind("torch", ("raymodel.backends.lightning._loop", "torch._dynamo"))
    packages = ("torch", "pytorch-lightning", "lightning")
    training = dataclasses.replace(TorchBackend.training, loop="raymodel.backends.lightning._loop:LightningLoop")
    inference = LightningInference()
    accepts = ("arrays", "torch_dataset", "batches", "ray_dataset")
    required_methods = ("setup",)
    hook_notes = {"before_batch": "yes (return value ignored)", "after_batch": "yes (the step's output)"}
    state_keys = ("modules", "lightning")
    LIGHTNING_FILE = "lightning.ckpt"

    def import_framework(self) -> None:
        require("torch", "lightning")
        _lightning()

    def write_state(self, model: Model, state: dict[str, Any], directory: Path) -> None:
        if "lightning" not in state:  # weights only (`model.save()` outside a run)
            return super().write_state(model, state, directory)
        import torch

        torch.save(state["lightning"], directory / self.LIGHTNING_FILE)  # Lightning's own checkpoint

    def read_state(self, model: Model, directory: Path) -> dict[str, Any]:
        path = directory / self.LIGHTNING_FILE
        if not path.is_file():
            return super().read_state(model, directory)
        import torch

        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        return {"lightning": checkpoint, "modules": {"module": checkpoint["state_dict"]}}

    def after_user_setup(self, model: Any, returned: Any) -> None:
        pl = _lightning()
        if returned is not None:
            model.module = returned
        if not isinstance(getattr(model, "module", None), pl.LightningModule):
            raise ModelDefinitionError(
                f"`{type(model).__name__}.setup` must return a `LightningModule` (or assign `self.module`); "
                f"got {type(getattr(model, 'module', returned)).__name__}."
            )


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

    def shard_modules(self) -> Any:
        """With ``strategy="fsdp"``: submodules whose classes become FSDP units (Lightning's
        ``auto_wrap_policy``), e.g. ``list(self.module.blocks)``; ``None`` (default): the module
        is one unit, its weights still sharded between steps."""
        return None
