"""``TorchBackend``: the facts, state and inference of PyTorch models; shared by the torch and
Lightning plug-ins (``torch.py``, ``lightning.py``), which do not import each other."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Sequence

from raymodel.contract import (
    DATA_PARALLEL,
    UNRECORDED_NAN,
    Backend,
    Inference,
    Model,
    PoolKind,
    RayTrain,
    Training,
    rows_of,
)
from raymodel.exceptions import DataError, ModelDefinitionError

if TYPE_CHECKING:
    import torch


_SHARDED = "sharded"  # the DCP checkpoint of strategy="fsdp", inside the state folder


class TorchTraining(RayTrain):
    """torch's runs: ``TorchTrainer``'s worker groups, gathering with ``torch.distributed`` (which DDP
    already set up)."""

    def options(self) -> dict[str, Any]:
        """``TorchTrainer``'s process group configured by ``ProcessGroup``: ``TorchConfig``'s settings and
        steps, but the run's controller does not import torch (``process_group.py``)."""
        from raymodel.backends.torch.process_group import ProcessGroup

        return {"torch_config": ProcessGroup()}

    def own(self, scaling_config: Any) -> tuple[str, dict[str, Any]] | None:
        """raymodel's own runs on Ray Train workers: Ray's ``DataParallelTrainer`` with ``ProcessGroup``,
        which is what ``TorchTrainer`` builds (its module imports torch: the process that fits a pool's
        run, or a one-off's, would import torch for nothing, before it asks for the run's controller).
        ``as_trainer()`` and a run of no workers (Ray Train's local mode: ``TorchTrainer``'s own) keep
        ``TorchTrainer``."""
        from raymodel.backends.torch.process_group import ProcessGroup

        if scaling_config.num_workers == 0:
            return None
        return DATA_PARALLEL, {"backend_config": ProcessGroup()}


class TorchInference(Inference[Model]):
    """A torch model's answers: its one module's, in eval mode without gradients; the first layer checks
    the width of an input the model has no recorded signature for (``checks_first_layer``)."""

    #: With no recorded signature, the first ``Linear`` or ``Conv`` layer ``forward`` reaches checks the
    #: width of what it is given (a ``DataError`` naming the layer, not torch's shape error).
    checks_first_layer: ClassVar[bool] = True

    def forward(self, model: Model, x: Any) -> Any:
        modules = TorchBackend.modules(model)
        if len(modules) != 1:
            raise ModelDefinitionError(
                f"`{type(model).__name__}` has {len(modules)} modules ({sorted(modules)}); define "
                "`forward(self, x)` to say how to combine them."
            )
        return next(iter(modules.values()))(x)

    def preprocess(self, model: Model, payload: Any) -> Any:
        import torch

        return torch.as_tensor(rows_of(payload))

    @contextlib.contextmanager
    def mode(self, model: Model) -> Iterator[None]:
        import torch

        named = TorchBackend.modules(model)
        modules = named.values()
        was_training = [m.training for m in modules]
        for m in modules:
            m.eval()
        guard = _first_layer_guard(model, named) if self.checks_first_layer and not model.input_signature else None
        try:
            with torch.inference_mode():
                yield
        finally:
            for m, flag in zip(modules, was_training):
                m.train(flag)
            for handle in guard or ():
                handle.remove()

    def stack(self, inputs: Sequence[Any]) -> Any:
        import torch

        if all(isinstance(x, torch.Tensor) for x in inputs):
            return torch.cat(list(inputs), dim=0)
        return super().stack(inputs)


class TorchBackend(Backend):
    name = "torch"
    extra = "torch"
    imports: ClassVar[tuple[str, ...]] = ("torch",)
    #: Lightning's and transformers' runs are this one's worker group: their jobs share its pools
    #: (``torch._dynamo``: what a first optimizer imports).
    pool: ClassVar[PoolKind | None] = PoolKind("torch", ("raymodel.backends.torch.loop", "torch._dynamo"))
    packages: ClassVar[tuple[str, ...]] = ("torch",)
    training: ClassVar[Training] = TorchTraining(
        "raymodel.backends.torch.loop:TorchLoop", "ray.train.torch.TorchTrainer", collective=True
    )
    accepts: ClassVar[tuple[str, ...]] = ("arrays", "torch_dataset", "batches", "async_batches", "ray_dataset")
    required_methods: ClassVar[tuple[str, ...]] = ("setup", "configure_optimizers", "train_step")
    hook_notes = {"before_batch": "yes (may replace the batch)", "after_batch": "yes (the step's output)"}
    state_keys: ClassVar[tuple[str, ...]] = ("modules", "optimizers", "schedulers", "sharded")
    gradient_steps = True  # precision, accumulation and clipping (TrainSettings)
    elastic = True  # DDP's process group is rebuilt at each (re)start, at the new world size
    strategies: ClassVar[tuple[str, ...]] = ("ddp", "fsdp")
    inference = TorchInference()

    @contextlib.contextmanager
    def isolated(self) -> Iterator[None]:
        """torch's process-wide settings as they were before the job; accelerator memory freed after it."""
        import torch

        saved = (
            torch.get_num_threads(),
            torch.get_default_dtype(),
            torch.is_grad_enabled(),
            torch.is_anomaly_enabled(),
            torch.are_deterministic_algorithms_enabled(),
            torch.random.get_rng_state(),
        )
        try:
            yield
        finally:
            threads, dtype, grad, anomaly, deterministic, rng = saved
            torch.set_num_threads(threads)
            torch.set_default_dtype(dtype)
            torch.set_grad_enabled(grad)
            torch.autograd.set_detect_anomaly(anomaly)
            torch.use_deterministic_algorithms(deterministic)
            torch.random.set_rng_state(rng)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield

    # ---------------------------------------------------------------- state
    @staticmethod
    def modules(model: Model) -> dict[str, torch.nn.Module]:
        """The ``torch.nn.Module`` attributes ``setup`` created, by attribute name."""
        import torch

        return {k: v for k, v in vars(model).items() if isinstance(v, torch.nn.Module)}

    def after_user_setup(self, model: Model, returned: Any) -> None:
        if not self.modules(model):
            raise ModelDefinitionError(
                f"`{type(model).__name__}.setup` created no `torch.nn.Module` attribute. Assign your "
                "network to an attribute, e.g. `self.net = nn.Sequential(...)`."
            )

    def get_state(self, model: Model) -> dict[str, Any]:
        """Weights, and during training the optimizers' and LR schedulers' states."""
        state: dict[str, Any] = {"modules": {k: m.state_dict() for k, m in self.modules(model).items()}}
        optimizers = getattr(model, "_optimizers", None)
        if optimizers:
            state["optimizers"] = [opt.state_dict() for opt in optimizers]
        schedulers = getattr(model, "_schedulers", None)
        if schedulers:
            state["schedulers"] = [s.state_dict() for s in schedulers]
        return state

    def write_state(self, model: Model, state: dict[str, Any], directory: Path) -> None:
        import torch

        if "sharded" in state:  # strategy="fsdp": every worker's shard, in one DCP checkpoint
            shutil.move(state["sharded"], directory / _SHARDED)
            state = {k: v for k, v in state.items() if k != "sharded"}
        torch.save(state, directory / "model.pt")  # torch's own format

    def read_state(self, model: Any, directory: Path) -> dict[str, Any]:
        """The state; a sharded checkpoint is loaded into a train worker's own shards in place (any
        number of workers wrote it), and anywhere else read whole (``_torch_fsdp.whole_state``)."""
        import torch

        state = torch.load(directory / "model.pt", map_location="cpu", weights_only=False)
        if not (directory / _SHARDED).is_dir():
            return state
        from raymodel.backends.torch import fsdp
        from raymodel.contract.checkpoint import MANIFEST

        modules = self.modules(model)
        if getattr(model, "_fsdp_roots", None):
            fsdp.load_shards(directory / _SHARDED, modules, model._optimizers)
            return state
        manifest = json.loads((directory.parent / MANIFEST).read_text())  # verified before this
        return {**state, "modules": fsdp.whole_state(directory, manifest["manifest_sha256"])}

    def set_state(self, model: Model, state: dict[str, Any]) -> None:
        modules = self.modules(model)
        missing = sorted(set(state.get("modules", {})) - set(modules))
        if missing:
            raise ModelDefinitionError(
                f"The checkpoint has weights for {missing}, but `{type(model).__name__}.setup` did not create them."
            )
        if getattr(model, "_fsdp_roots", None) and state.get("modules"):  # whole weights into the shards
            from raymodel.backends.torch import fsdp

            fsdp.load_whole_into_shards(state["modules"], modules)
            state = {k: v for k, v in state.items() if k != "optimizers"}  # a whole run's: not these shards'
        else:
            for name, sd in state.get("modules", {}).items():
                modules[name].load_state_dict(sd)
        for attr in ("optimizers", "schedulers"):  # present on a train worker only
            live = getattr(model, f"_{attr}", None)
            if live and state.get(attr):
                for obj, sd in zip(live, state[attr]):
                    obj.load_state_dict(sd)

    def unrecorded_signature(self, model: Model) -> dict[str, Any] | None:
        """NaN, None or infinity in a network's input gives NaN answers: refused. Its width is checked as
        ``forward`` reaches the first layer (``inference``)."""
        return {"nonfinite": "error", "why": UNRECORDED_NAN}


def _first_layer_guard(model: Model, modules: dict[str, Any]) -> list[Any]:
    """Hooks on every ``Linear`` and ``ConvNd`` layer: the first one ``forward`` reaches checks the size
    of its input's features (channels) against its own, before torch would fail on it; the rest stand by."""
    from torch import nn

    layers = [
        (f"{top}.{name}" if name else top, layer)
        for top, module in modules.items()
        for name, layer in module.named_modules()
        if isinstance(layer, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))
    ]
    reached = False

    def check(name: str, layer: Any, args: tuple[Any, ...]) -> None:
        nonlocal reached
        if reached or not args or getattr(args[0], "shape", None) is None:
            return
        reached = True
        shape = tuple(args[0].shape)
        if isinstance(layer, nn.Linear):
            wanted, got, what = layer.in_features, shape[-1] if shape else None, "values a row"
        else:  # (N, C, ...) or unbatched (C, ...)
            dims = len(layer.kernel_size)
            wanted = layer.in_channels
            got = shape[-(dims + 1)] if len(shape) > dims else None
            what = "channels"
        if got != wanted:
            raise DataError(
                f"the input does not fit `{type(model).__name__}`'s first layer: `{name}` "
                f"({type(layer).__name__}) takes {wanted} {what}, got {got} (an input of shape {shape})"
            )

    return [
        layer.register_forward_pre_hook(lambda layer, args, name=name: check(name, layer, args))
        for name, layer in layers
    ]
