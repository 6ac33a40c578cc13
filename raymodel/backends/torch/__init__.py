"""PyTorch: ``RayTorchModel`` on Ray Train's ``TorchTrainer`` with DDP (or FSDP: ``strategy="fsdp"``).

Hooks: every hook of ``raymodel.hooks``, in the documented order. An
epoch is one pass over the worker's shard of the training split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raymodel.backends.torch.backend import TorchBackend
from raymodel.exceptions import ModelDefinitionError
from raymodel.model import RayModel

if TYPE_CHECKING:
    import torch


class RayTorchModel(RayModel):
    """A PyTorch model trained with DDP (or FSDP, ``strategy="fsdp"``) on Ray Train's ``TorchTrainer``.

    Define ``setup(config)`` (assign ``torch.nn`` modules to attributes),
    ``configure_optimizers()``, ``forward(x)`` and ``train_step(batch)``
    (return a loss, or a dict holding ``"loss"``); optionally
    ``validation_step(batch)`` returning a dict of metrics.

    With ``automatic_optimization = False`` the step does the optimization
    itself, with ``self.optimizers()`` and ``self.manual_backward(loss)``
    (which averages gradients across workers).

    Example:
        >>> class Net(rm.RayTorchModel):
        ...     def setup(self, config):
        ...         self.net = nn.Linear(4, 3)
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.net.parameters(), lr=0.1)
        ...     def train_step(self, batch):
        ...         x, y = batch
        ...         return F.cross_entropy(self(x), y)
    """

    backend = TorchBackend()
    #: When False, ``train_step`` calls ``zero_grad``/``manual_backward``/``step`` itself.
    automatic_optimization: bool = True

    def configure_optimizers(self) -> Any:
        """Return an optimizer, a list of them, ``(optimizer, scheduler)``, or
        ``{"optimizer": ..., "lr_scheduler": scheduler or {"scheduler": ..., "interval": "epoch" | "step",
        "monitor": "val_loss"}}`` (Lightning's forms). Epoch schedulers step after each epoch; a
        ``ReduceLROnPlateau`` steps on ``val_loss`` unless ``monitor`` names another metric."""
        raise ModelDefinitionError(f"`{type(self).__name__}` must define `configure_optimizers(self)`.")

    def train_step(self, batch: Any) -> Any:
        """One training step on ``batch``; return a loss tensor or a dict with ``"loss"``."""
        raise ModelDefinitionError(f"`{type(self).__name__}` must define `train_step(self, batch)`.")

    def validation_step(self, batch: Any) -> Any:
        """Metrics on a validation batch: a dict of scalars, or a loss tensor (``val_loss``).
        Keys without a ``val_`` prefix get one."""
        return None

    @property
    def device(self) -> torch.device:
        """Where this model's parameters live (the worker's GPU with ``use_gpu=True``)."""
        import torch

        for module in TorchBackend.modules(self).values():
            for p in module.parameters():
                return p.device
        return torch.device("cpu")

    def shard_modules(self) -> Any:
        """With ``strategy="fsdp"``: the submodules that become FSDP units (each gathers its
        weights for its own forward and backward, then frees them), e.g. ``list(self.blocks)``.
        ``None`` (default): every direct child, that holds parameters, of each module ``setup``
        created. Each module itself is then sharded as a whole."""
        return None

    def optimizers(self) -> Any:
        """The optimizer(s) from ``configure_optimizers`` (one, or a list if several)."""
        opts = getattr(self, "_optimizers", None)
        if opts is None:
            raise ModelDefinitionError("`optimizers()` is only available inside a training run.")
        return opts[0] if len(opts) == 1 else list(opts)

    def lr_schedulers(self) -> Any:
        """The LR scheduler(s) from ``configure_optimizers`` (one, or a list)."""
        scheds = getattr(self, "_schedulers", [])
        return scheds[0] if len(scheds) == 1 else list(scheds)

    def manual_backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, then average the gradients over all workers.

        It keeps to the run's ``TrainSettings``: the loss is divided by
        ``accumulate_grad_batches`` (step your optimizers every that many
        batches), and on a batch where a step is due the gradients are clipped
        by ``grad_clip_norm`` / ``grad_clip_value``. (``precision`` already
        applies: ``train_step`` runs under its autocast.)
        """
        from raymodel.backends.torch.loop import average_gradients

        control = getattr(self, "_step_control", None)
        if control is None:
            loss.backward()
        else:
            control.backward(loss)
        if not getattr(self, "_fsdp_roots", None):  # FSDP reduce-scattered them in the backward
            average_gradients(TorchBackend.modules(self).values())
        if control is not None and getattr(self, "_step_due", True):
            control.clip(getattr(self, "_optimizers", []))  # the train loop's (configure_optimizers')


__all__ = ["RayTorchModel", "TorchBackend"]
