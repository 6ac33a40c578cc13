"""PyTorch: ``RayTorchModel`` on Ray Train's ``TorchTrainer`` with DDP.

Hooks: every hook of :mod:`raymodel.hooks`, in the documented order. An
epoch is one pass over the worker's shard of the training split.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from raymodel.backends.base import Backend, rows_of, to_jsonable
from raymodel.exceptions import ModelDefinitionError
from raymodel.model import RayModel

if TYPE_CHECKING:
    import torch


class TorchBackend(Backend):
    name = "torch"
    extra = "torch"
    imports = ("torch",)
    packages = ("torch",)
    trainer = "ray.train.torch.TorchTrainer"
    accepts = ("arrays", "torch_dataset", "batches", "async_batches", "ray_dataset")
    required_methods = ("setup", "configure_optimizers", "train_step")
    hook_notes = {"before_batch": "yes (may replace the batch)", "after_batch": "yes (the step's output)"}
    state_keys = ("modules", "optimizers", "schedulers")
    native_collective = True  # torch.distributed, which DDP already set up
    gradient_steps = True  # precision, accumulation and clipping (TrainSettings)

    def worker_loop(self, run: Any) -> Any:
        from raymodel.backends._torch_loop import TorchLoop

        return TorchLoop(run)

    # ---------------------------------------------------------------- state
    @staticmethod
    def modules(model: RayModel) -> dict[str, "torch.nn.Module"]:
        """The ``torch.nn.Module`` attributes ``setup`` created, by attribute name."""
        import torch

        return {k: v for k, v in vars(model).items() if isinstance(v, torch.nn.Module)}

    def after_user_setup(self, model: RayModel, returned: Any) -> None:
        if not self.modules(model):
            raise ModelDefinitionError(
                f"`{type(model).__name__}.setup` created no `torch.nn.Module` attribute. Assign your "
                "network to an attribute, e.g. `self.net = nn.Sequential(...)`."
            )

    def get_state(self, model: RayModel) -> dict[str, Any]:
        """Weights, and during training the optimizers' and LR schedulers' states."""
        state: dict[str, Any] = {"modules": {k: m.state_dict() for k, m in self.modules(model).items()}}
        optimizers = getattr(model, "_optimizers", None)
        if optimizers:
            state["optimizers"] = [opt.state_dict() for opt in optimizers]
        schedulers = getattr(model, "_schedulers", None)
        if schedulers:
            state["schedulers"] = [s.state_dict() for s in schedulers]
        return state

    def write_state(self, model: RayModel, state: dict[str, Any], directory: Path) -> None:
        import torch

        torch.save(state, directory / "model.pt")  # torch's own format

    def read_state(self, model: RayModel, directory: Path) -> dict[str, Any]:
        import torch

        return torch.load(directory / "model.pt", map_location="cpu", weights_only=False)

    def set_state(self, model: RayModel, state: dict[str, Any]) -> None:
        modules = self.modules(model)
        missing = sorted(set(state.get("modules", {})) - set(modules))
        if missing:
            raise ModelDefinitionError(
                f"The checkpoint has weights for {missing}, but `{type(model).__name__}.setup` did not create them."
            )
        for name, sd in state.get("modules", {}).items():
            modules[name].load_state_dict(sd)
        for attr in ("optimizers", "schedulers"):  # present on a train worker only
            live = getattr(model, f"_{attr}", None)
            if live and state.get(attr):
                for obj, sd in zip(live, state[attr]):
                    obj.load_state_dict(sd)

    # ------------------------------------------------------------ inference
    def forward(self, model: RayModel, x: Any) -> Any:
        modules = self.modules(model)
        if len(modules) != 1:
            raise ModelDefinitionError(
                f"`{type(model).__name__}` has {len(modules)} modules ({sorted(modules)}); define "
                "`forward(self, x)` to say how to combine them."
            )
        return next(iter(modules.values()))(x)

    def preprocess(self, model: RayModel, payload: Any) -> Any:
        import torch

        return torch.as_tensor(rows_of(payload))

    def postprocess(self, model: RayModel, output: Any) -> Any:
        return to_jsonable(output)

    @contextlib.contextmanager
    def inference(self, model: RayModel) -> Iterator[None]:
        import torch

        modules = self.modules(model).values()
        was_training = [m.training for m in modules]
        for m in modules:
            m.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            for m, flag in zip(modules, was_training):
                m.train(flag)

    def stack(self, inputs: Sequence[Any]) -> Any:
        import torch

        if all(isinstance(x, torch.Tensor) for x in inputs):
            return torch.cat(list(inputs), dim=0)
        return super().stack(inputs)


class RayTorchModel(RayModel):
    """A PyTorch model trained with DDP on Ray Train's ``TorchTrainer``.

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
    def device(self) -> "torch.device":
        """Where this model's parameters live (the worker's GPU with ``use_gpu=True``)."""
        import torch

        for module in TorchBackend.modules(self).values():
            for p in module.parameters():
                return p.device
        return torch.device("cpu")

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

    def manual_backward(self, loss: "torch.Tensor") -> None:
        """``loss.backward()``, then average the gradients over all workers.

        It keeps to the run's ``TrainSettings``: the loss is divided by
        ``accumulate_grad_batches`` (step your optimizers every that many
        batches), and on a batch where a step is due the gradients are clipped
        by ``grad_clip_norm`` / ``grad_clip_value``. (``precision`` already
        applies: ``train_step`` runs under its autocast.)
        """
        from raymodel.backends._torch_loop import average_gradients

        control = getattr(self, "_step_control", None)
        if control is None:
            loss.backward()
        else:
            control.backward(loss)
        average_gradients(TorchBackend.modules(self).values())
        if control is not None and getattr(self, "_step_due", True):
            control.clip(self._optimizers)


__all__ = ["RayTorchModel", "TorchBackend"]
