"""The worker side of ``RayLightningModel``: Lightning's ``Trainer`` drives ``WorkerRun``'s phases.

Lightning owns its fit loop, so this loop maps Lightning's callback points
onto ``WorkerRun``'s phase methods (the order is checked there). ``Trainer.fit``
runs in a thread; the callbacks reach the run's event loop with ``run.sync``.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

import torch
from ray.train.lightning import RayDDPStrategy, RayFSDPStrategy, RayLightningEnvironment, prepare_trainer
from torch.utils.data import DataLoader, TensorDataset

from raymodel._internal import tmp
from raymodel.backends.lightning._import import lightning as _lightning
from raymodel.backends.torch.arrays import to_tensor
from raymodel.backends.torch.loop import ShardSampler, TorchLoop
from raymodel.backends.torch.optim import set_hyperparameters
from raymodel.data import Arrays, Batches, RayDataset, TorchDataset, worker_batches

if TYPE_CHECKING:
    from raymodel.contract import RunOnWorker

pl = _lightning()


class LightningLoop(TorchLoop):
    """Builds the loaders and the ``Trainer``; resumes with ``Trainer.fit(ckpt_path=...)``."""

    def __init__(self, run: RunOnWorker) -> None:
        super().__init__(run)
        self.trainer: Any = None
        self.resume: dict[str, Any] | None = None
        self.pending_config: dict[str, Any] = {}  # config changes for optimizers not made yet

    def build(self) -> None:
        """Lightning creates the optimizers itself, inside ``fit``."""
        self.model._optimizers, self.model._scheduler_configs, self.model._schedulers = [], [], []

    def ready(self) -> None:
        """DDP is Lightning's strategy's job."""

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)  # the weights
        self.resume = state.get("lightning")  # the rest: Lightning restores it in `fit`

    def apply_config(self, changes: dict[str, Any]) -> None:
        """Set on the ``Trainer``'s optimizers; before ``fit`` made them (a change made while the job
        was queued, or replayed from a checkpoint), once they exist (``_LightningPhases.on_train_start``)."""
        if self.trainer is not None and self.trainer.optimizers:
            set_hyperparameters(self.trainer.optimizers, changes)
        else:
            self.pending_config = {**self.pending_config, **changes}

    def settings_changed(self) -> None:
        if self.trainer is not None:
            self.trainer.fit_loop.max_epochs = self.run.num_epochs

    def get_state(self) -> dict[str, Any]:
        """Lightning's own checkpoint; ``save_checkpoint`` is a collective, so every worker calls it."""
        with tmp.tempdir("lightning") as staging:
            path = os.path.join(staging, "checkpoint.ckpt")
            self.trainer.save_checkpoint(path)  # rank 0 writes the file
            if self.run.rank != 0:
                return {}
            return {"lightning": torch.load(path, map_location="cpu", weights_only=False)}

    async def run_epochs(self, first: int, last: int) -> None:
        trainer = self._trainer(last)
        train = self._loader("train")
        valid = self._loader("valid") if self.has_validation else None
        with tmp.tempdir("lightning") as staging:
            ckpt_path = None
            if self.resume is not None and "loops" in self.resume:
                ckpt_path = os.path.join(staging, "resume.ckpt")
                torch.save(self.resume, ckpt_path)
            await asyncio.to_thread(
                trainer.fit, self.model.module, train_dataloaders=train, val_dataloaders=valid, ckpt_path=ckpt_path
            )

    async def score(self) -> dict[str, float]:
        """``Trainer.validate`` over the validation split (its callback runs the run's validation phase)."""
        trainer = self._trainer(1)
        await asyncio.to_thread(trainer.validate, self.model.module, dataloaders=self._loader("valid"), verbose=False)
        return {k: v for k, v in _scalars(self.trainer).items() if k.startswith("val")}

    def _trainer(self, last: int) -> Any:
        """The ``Trainer`` (kept as ``self.trainer``), prepared for Ray Train on a worker group's worker."""
        run, settings = self.run, self.run.settings
        # On a Ray Train worker: Ray's DDP (or FSDP) strategy; in a Tune trial: one process, Lightning's default.
        placement = (
            {"strategy": self._strategy(), "plugins": [RayLightningEnvironment()], "devices": "auto"}
            if run.session.in_worker_group
            else {"devices": 1}
        )
        self.trainer = pl.Trainer(
            max_epochs=last,
            accelerator="gpu" if settings.use_gpu else "cpu",
            callbacks=[_LightningPhases(run, self)],
            use_distributed_sampler=False,  # raymodel's sharding policy (ShardSampler) instead
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            **placement,
            **_step_arguments(settings),
        )
        return prepare_trainer(self.trainer) if run.session.in_worker_group else self.trainer

    def _strategy(self) -> Any:
        """Ray's DDP strategy, or with ``strategy="fsdp"`` its FSDP one: each class of the modules
        ``shard_modules()`` names is an FSDP unit, and checkpoints hold the whole state
        (Lightning's ``state_dict_type="full"``, gathered on rank 0)."""
        if not self.fsdp:
            return RayDDPStrategy()
        units = self.model.shard_modules()
        policy = {"auto_wrap_policy": {type(m) for m in units}} if units else {}
        return _RayFSDP(state_dict_type="full", **policy)

    def _loader(self, split_name: str) -> Any:
        split, train = self.run.splits[split_name], split_name == "train"
        rank, world, s = self.run.rank, self.run.world, self.run.settings
        if isinstance(split, Arrays):
            x = to_tensor(split.x)
            dataset = TensorDataset(x) if split.y is None else TensorDataset(x, to_tensor(split.y))
            split = TorchDataset(dataset)
        if isinstance(split, TorchDataset):
            sampler = ShardSampler(len(split.dataset), rank, world, train=train, shuffle=s.shuffle, seed=s.seed)
            return DataLoader(split.dataset, batch_size=s.batch_size, sampler=sampler)
        if isinstance(split, Batches):
            return _Reiterable(lambda: worker_batches(split.iterable, rank, world, train=train))
        if isinstance(split, RayDataset):
            shard = split.shard(self.run.rank)
            return _Reiterable(lambda: iter(shard.iter_torch_batches(batch_size=s.batch_size)))
        raise TypeError(f"Unsupported split {type(split).__name__}")


class _RayFSDP(RayFSDPStrategy):
    """Ray's FSDP strategy, on CPU too. Lightning hands FSDP the device's index (None on CPU), and
    FSDP then looks for an accelerator: here a CPU module is wrapped with the CPU named. Lightning
    gathers the whole state with ``offload_to_cpu=True``, which crashes FSDP when the weights are on
    the CPU already (a segfault cloning the gathered weights): here the CPU's state is gathered as is."""

    kwargs: dict[str, Any]  # Lightning's FSDPStrategy: what it hands FSDP

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self.root_device.type != "cpu":
            return super().lightning_module_state_dict()
        with _whole_state(self.model):
            return self.model.state_dict()

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        if self.root_device.type != "cpu":
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullyShardedDataParallel, OptimStateKeyType

        optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer's own
        with _whole_state(self.model):
            state = FullyShardedDataParallel.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # Lightning's layout: keyed by parameter id
                state = FullyShardedDataParallel.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state

    def _setup_model(self, model: Any) -> Any:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if self.root_device.type == "cpu" and not isinstance(model, FullyShardedDataParallel):
            kwargs = {k: v for k, v in self.kwargs.items() if k != "auto_wrap_policy"}
            model = FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=torch.device("cpu"),
                auto_wrap_policy=self.kwargs.get("auto_wrap_policy"),
                **kwargs,
            )
            self.kwargs = kwargs  # wrapped: Lightning's own wrap is skipped, its policy unused
        return super()._setup_model(model)


def _whole_state(model: Any) -> Any:
    """FSDP's whole-state context, gathered on rank 0 and left where it is (the CPU)."""
    from torch.distributed.fsdp import (
        FullOptimStateDictConfig,
        FullStateDictConfig,
        FullyShardedDataParallel as FSDP,
        StateDictType,
    )

    return FSDP.state_dict_type(
        module=model,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=True),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True),
    )


class _Reiterable:
    """What Lightning iterates once per epoch: a fresh iterator each time."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def __iter__(self) -> Any:
        return self.make()


_Callback: Any = pl.Callback  # Lightning's, from the package that is installed


class _LightningPhases(_Callback):
    """Lightning's callback points -> ``WorkerRun``'s phases and batch hooks."""

    def __init__(self, run: RunOnWorker, loop: LightningLoop) -> None:
        self.run, self.loop = run, loop
        self.losses: list[torch.Tensor] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.loop.pending_config:  # after Lightning restored its checkpoint: the change wins
            set_hyperparameters(trainer.optimizers, self.loop.pending_config)
            self.loop.pending_config = {}

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.losses = []
        self.run.sync(self.run.begin_epoch(trainer.current_epoch + 1))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.run.hooks.has("before_batch"):
            self.run.sync(self.run.before_batch(batch, batch_idx))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self.losses.append(loss.detach().float().cpu())
        if self.run.hooks.has("after_batch") or self.run.progress is not None:
            self.run.sync(self.run.after_batch(batch_idx, outputs))

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.run.sync(self.run.begin_validation())

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        val = {k: v for k, v in _scalars(trainer).items() if k.startswith("val")}
        self.run.sync(self.run.end_validation(val))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        total = float(torch.stack(self.losses).sum()) if self.losses else 0.0
        metrics = {**_scalars(trainer), **self.run.mean_over_workers({"loss": (total, len(self.losses))})}
        if self.run.sync(self.run.end_epoch(trainer.current_epoch + 1, metrics)):
            trainer.should_stop = True


def _scalars(trainer: Any) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if isinstance(v, torch.Tensor) and v.numel() == 1}


def _step_arguments(settings: Any) -> dict[str, Any]:
    """``TrainSettings``' precision, accumulation and clipping as Lightning's ``Trainer`` arguments."""
    clip = settings.grad_clip_norm if settings.grad_clip_norm is not None else settings.grad_clip_value
    return {
        "precision": "32-true" if settings.precision == "32" else settings.precision,
        "accumulate_grad_batches": settings.accumulate_grad_batches,
        "gradient_clip_val": clip,
        "gradient_clip_algorithm": "value" if settings.grad_clip_value is not None else "norm",
    }
