"""The worker side of ``RayLightningModel``: data loaders, the hook bridge, ``Trainer.fit``."""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
from torch.utils.data import DataLoader, TensorDataset

from raymodel.backends._session import WorkerRun
from raymodel.backends.lightning import _lightning
from raymodel.data import Arrays, Batches, TorchDataset
from raymodel.data._loading import round_robin
from raymodel.exceptions import DataError

pl = _lightning()


class HookBridge(pl.Callback):
    """Turns Lightning's callback hooks into raymodel's hooks, and ends each epoch
    the raymodel way (history, checkpoint, ``ray.train.report``)."""

    def __init__(self, run: WorkerRun, loop: asyncio.AbstractEventLoop) -> None:
        self.run, self.loop = run, loop
        self.offset = len(run.history)
        self.losses: list[torch.Tensor] = []

    def _wait(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _epoch(self, trainer: Any) -> int:
        return self.offset + trainer.current_epoch + 1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._wait(self.run.hooks.call("before_fit"))

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.losses = []
        self._wait(self.run.hooks.call("before_epoch", self._epoch(trainer)))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.run.hooks.has("before_batch"):
            self._wait(self.run.hooks.before_batch(batch, batch_idx))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self.losses.append(loss.detach().float())
        if self.run.hooks.has("after_batch"):
            self._wait(self.run.hooks.call("after_batch", batch_idx, outputs))

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._wait(self.run.hooks.call("before_validation"))

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
            self._wait(self.run.hooks.call("after_validation", val))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        total = torch.stack(self.losses).sum() if self.losses else torch.tensor(0.0)
        stats = torch.stack([total.cpu(), torch.tensor(float(len(self.losses)))]).to(pl_module.device)
        stats = trainer.strategy.reduce(stats, reduce_op="sum")
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if isinstance(v, torch.Tensor) and v.numel() == 1}
        metrics["loss"] = float(stats[0] / stats[1]) if float(stats[1]) else float("nan")
        epoch = self._epoch(trainer)
        self._wait(self.run.hooks.call("after_epoch", epoch, metrics))
        self._wait(self.run.end_epoch(epoch, metrics))


async def fit(loop_config: dict[str, Any]) -> dict[str, Any]:
    run = WorkerRun(loop_config)
    torch.manual_seed(run.settings.seed)
    await run.setup_model()
    await run.restore()
    splits = run.splits()
    settings = run.settings
    train = _loader(splits["train"], settings.batch_size, shuffle=settings.shuffle, run=run)
    valid = _loader(splits["valid"], settings.batch_size, shuffle=False, run=run) if "valid" in splits else None
    remaining = run.num_epochs - len(run.history)
    if remaining > 0:
        loop = asyncio.new_event_loop()
        trainer = pl.Trainer(
            max_epochs=remaining, devices="auto", accelerator="gpu" if settings.use_gpu else "cpu",
            strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
            callbacks=[HookBridge(run, loop)], enable_checkpointing=False, logger=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        )
        trainer = prepare_trainer(trainer)
        # Lightning's loop is synchronous; the bridge runs async hooks on its own event loop
        # in a worker thread, so this coroutine's loop is not re-entered.
        await asyncio.to_thread(trainer.fit, run.model.module, train_dataloaders=train, val_dataloaders=valid)
        loop.close()
    return await run.finish()


class _Shared:
    """A re-iterable of ready batches, round-robin over workers (whole rounds only)."""

    def __init__(self, iterable: Any, rank: int, world: int) -> None:
        self.iterable, self.rank, self.world = iterable, rank, world

    def __iter__(self) -> Any:
        return round_robin(self.iterable, self.rank, self.world)


def _loader(split: Any, batch_size: int, shuffle: bool, run: WorkerRun) -> Any:
    """Lightning (with ``prepare_trainer``) adds the distributed sampler to DataLoaders itself."""
    if isinstance(split, Arrays):
        x = torch.from_numpy(_float_or_long(split.x))
        tensors = (x,) if split.y is None else (x, torch.from_numpy(_float_or_long(split.y)))
        return DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=shuffle)
    if isinstance(split, TorchDataset):
        return DataLoader(split.dataset, batch_size=batch_size, shuffle=shuffle)
    if isinstance(split, Batches) and not split.is_async:
        return _Shared(split.iterable, run.rank, run.world)
    raise DataError(f"The lightning backend takes arrays, torch Datasets and iterables of batches "
                    f"(got {type(split).__name__}).")


def _float_or_long(a: Any) -> Any:
    import numpy as np

    a = np.array(a)
    return a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) else a.astype(np.int64)
