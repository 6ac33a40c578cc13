"""The worker loop of ``RayTorchModel``: data, DDP, optimization, metrics.

Runs on every Ray Train worker inside ``asyncio.run``: synchronous steps and
hooks are called directly, ``async def`` ones are awaited, and the next batch
is always loaded in the background while the current one is processed.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterable

import numpy as np

from raymodel.backends._session import WorkerRun
from raymodel.backends.base import batch_len
from raymodel.data import Arrays, Batches, RayDataset, TorchDataset, aprefetch, prefetch, shard_indices
from raymodel.data._loading import around_robin, round_robin
from raymodel.exceptions import ModelDefinitionError
from raymodel.exceptions import HookError
from raymodel.hooks import maybe_await

import torch
import torch.distributed as dist
from torch import nn


class TorchLoop:
    """Trains one worker's model replica for ``settings.num_epochs`` epochs."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.run = WorkerRun(payload)
        self.model = self.run.model
        self.settings = self.run.settings
        import ray.train.torch

        self.device = ray.train.torch.get_device()
        self.distributed = self.run.world > 1 and dist.is_available() and dist.is_initialized()

    async def fit(self) -> dict[str, Any]:
        run, model = self.run, self.model
        torch.manual_seed(self.settings.seed)
        await run.setup_model()
        modules = model.backend.modules(model)
        for m in modules.values():
            m.to(self.device)
        model._optimizers, model._schedulers = _optimizers(model)
        await run.restore()
        self.step_module = self._wrap(modules)
        splits = run.splits()
        self.train_data = splits["train"]
        self.valid_data = splits.get("valid")
        await run.hooks.call("before_fit")
        for epoch in run.epochs():
            await run.hooks.call("before_epoch", epoch)
            metrics = await self._train_epoch(epoch)
            for scheduler in model._schedulers:
                scheduler.step()
            if self.valid_data is not None:
                await run.hooks.call("before_validation")
                val_metrics = await self._validate()
                await run.hooks.call("after_validation", val_metrics)
                metrics.update(val_metrics)
            await run.hooks.call("after_epoch", epoch, metrics)
            await run.end_epoch(epoch, metrics)
        return await run.finish()

    # ------------------------------------------------------------ training
    def _wrap(self, modules: dict[str, nn.Module]) -> nn.Module | None:
        """DDP over a module whose forward is the user's ``train_step`` (automatic
        optimization); with manual optimization, only broadcast rank 0's weights."""
        if not self.distributed:
            return None
        if not self.model.automatic_optimization:
            for m in modules.values():
                for tensor in list(m.parameters()) + list(m.buffers()):
                    dist.broadcast(tensor.data, src=0)
            return None
        from torch.nn.parallel import DistributedDataParallel

        step = _StepModule(self.model, modules)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(step, device_ids=device_ids)

    async def _train_epoch(self, epoch: int) -> dict[str, float]:
        model, hooks = self.model, self.run.hooks
        for m in model.backend.modules(model).values():
            m.train()
        auto = model.automatic_optimization
        optimizers = model._optimizers
        step = self.step_module if self.step_module is not None else model.train_step
        sums: dict[str, torch.Tensor] = {}
        n_batches = 0
        async for batch_idx, batch in _aenumerate(self._batches(self.train_data, train=True, epoch=epoch)):
            batch = _to_device(batch, self.device)
            if hooks.has("before_batch"):
                batch = await hooks.before_batch(batch, batch_idx)
            if auto:
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
            outputs = await _call_step(step, batch, "train_step")
            loss = _loss_of(outputs)
            if auto:
                loss.backward()
                for opt in optimizers:
                    opt.step()
            _accumulate(sums, outputs, loss)
            n_batches += 1
            if hooks.has("after_batch"):
                await hooks.call("after_batch", batch_idx, outputs)
        return self._reduce_mean(sums, n_batches)

    def _reduce_mean(self, sums: dict[str, torch.Tensor], n_batches: int) -> dict[str, float]:
        """Mean of each step output over all workers' batches."""
        local = {k: (float(v), n_batches) for k, v in sums.items()}
        totals = self._all_gather_sum(local)
        return {k: s / n for k, (s, n) in totals.items() if n}

    # ---------------------------------------------------------- validation
    async def _validate(self) -> dict[str, float]:
        model = self.model
        modules = model.backend.modules(model).values()
        for m in modules:
            m.eval()
        sums: dict[str, tuple[float, int]] = {}
        with torch.no_grad():
            async for batch in self._batches(self.valid_data, train=False, epoch=0):
                batch = _to_device(batch, self.device)
                out = await maybe_await(model.validation_step(batch))
                if out is None:
                    continue
                if isinstance(out, torch.Tensor):
                    out = {"val_loss": out}
                if not isinstance(out, dict):
                    raise ModelDefinitionError(
                        f"`validation_step` must return a dict of metrics or a loss tensor (got {type(out).__name__})."
                    )
                n = batch_len(batch)
                for key, value in out.items():
                    name = key if key.startswith("val_") else f"val_{key}"
                    s, c = sums.get(name, (0.0, 0))
                    sums[name] = (s + float(value) * n, c + n)
        for m in modules:
            m.train()
        totals = self._all_gather_sum(sums)
        return {k: s / n for k, (s, n) in sorted(totals.items()) if n}

    def _all_gather_sum(self, local: dict[str, tuple[float, int]]) -> dict[str, tuple[float, int]]:
        """Add up ``{name: (sum, count)}`` over every worker (one collective per call)."""
        if not self.distributed:
            return dict(local)
        gathered: list[Any] = [None] * self.run.world
        dist.all_gather_object(gathered, local)
        totals: dict[str, tuple[float, int]] = {}
        for part in gathered:
            for k, (s, n) in part.items():
                ts, tn = totals.get(k, (0.0, 0))
                totals[k] = (ts + s, tn + n)
        return totals

    # ---------------------------------------------------------------- data
    async def _batches(self, split: Any, *, train: bool, epoch: int) -> AsyncIterator[Any]:
        rank, world = self.run.rank, self.run.world
        if isinstance(split, Batches) and split.is_async:
            source = around_robin(split.iterable, rank, world) if train else _async_shard(split.iterable, rank, world)
            async for batch in aprefetch(source):
                yield batch
            return
        for batch in prefetch(self._sync_batches(split, train=train, epoch=epoch)):
            yield batch

    def _sync_batches(self, split: Any, *, train: bool, epoch: int) -> Iterable[Any]:
        rank, world, s = self.run.rank, self.run.world, self.settings
        if isinstance(split, Arrays):
            x, y = _tensor(split.x), None if split.y is None else _tensor(split.y, label=True)
            idx = torch.from_numpy(shard_indices(len(split), rank, world, shuffle=train and s.shuffle,
                                                 seed=s.seed, epoch=epoch, pad=train))
            return _array_batches(x, y, idx, s.batch_size)
        if isinstance(split, TorchDataset):
            return _dataset_loader(split.dataset, rank, world, s.batch_size, train=train,
                                   shuffle=s.shuffle, seed=s.seed, epoch=epoch)
        if isinstance(split, RayDataset):
            import ray.train

            shard = ray.train.get_dataset_shard(split.key)
            return shard.iter_torch_batches(batch_size=s.batch_size)
        if isinstance(split, Batches):
            return round_robin(split.iterable, rank, world) if train else _sync_shard(split.iterable, rank, world)
        raise TypeError(f"Unsupported split {type(split).__name__}")


class _StepModule(nn.Module):
    """Holds the user's modules so DDP sees their parameters; ``forward`` runs ``train_step``.

    Calling the step through DDP's forward is what arms its gradient all-reduce.
    """

    def __init__(self, model: Any, modules: dict[str, nn.Module]) -> None:
        super().__init__()
        self.inner = nn.ModuleDict(modules)
        self.__dict__["_model"] = model

    def forward(self, batch: Any) -> Any:
        return self.__dict__["_model"].train_step(batch)


def average_gradients(modules: Iterable[nn.Module]) -> None:
    """All-reduce and average gradients across workers (manual optimization)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    grads = [p.grad for m in modules for p in m.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def _optimizers(model: Any) -> tuple[list[Any], list[Any]]:
    configured = model.configure_optimizers()
    schedulers: list[Any] = []
    if isinstance(configured, dict):
        if "optimizer" not in configured:
            raise ModelDefinitionError("`configure_optimizers` returned a dict without an `optimizer` key.")
        scheduler = configured.get("lr_scheduler")
        configured = configured["optimizer"]
        if scheduler is not None:
            schedulers = list(scheduler) if isinstance(scheduler, (list, tuple)) else [scheduler]
    optimizers = list(configured) if isinstance(configured, (list, tuple)) else [configured]
    if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise ModelDefinitionError(
            f"`configure_optimizers` must return a `torch.optim.Optimizer`, a list of them, or "
            f"`{{'optimizer': ..., 'lr_scheduler': ...}}` (got {configured!r})."
        )
    return optimizers, schedulers


async def _call_step(step: Any, batch: Any, name: str) -> Any:
    try:
        return await maybe_await(step(batch))
    except (HookError, ModelDefinitionError):
        raise
    except Exception as exc:
        raise HookError(f"`{name}` raised {type(exc).__name__}: {exc}") from exc


def _loss_of(outputs: Any) -> torch.Tensor:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ModelDefinitionError(
            "`train_step` must return a scalar loss tensor or a dict holding one under `loss` "
            f"(got {type(outputs).__name__})."
        )
    return loss


def _accumulate(sums: dict[str, torch.Tensor], outputs: Any, loss: torch.Tensor) -> None:
    value = loss.detach()
    sums["loss"] = sums["loss"] + value if "loss" in sums else value.clone()
    if isinstance(outputs, dict):
        for k, v in outputs.items():
            if k != "loss" and isinstance(v, (torch.Tensor, float, int)) and getattr(v, "numel", lambda: 1)() == 1:
                v = v.detach() if isinstance(v, torch.Tensor) else torch.tensor(float(v))
                sums[k] = sums[k] + v if k in sums else v.clone()


def _tensor(a: np.ndarray, label: bool = False) -> torch.Tensor:
    # A copy: arrays from the object store are read-only, and torch wants writable memory.
    dtype = np.float32 if np.issubdtype(a.dtype, np.floating) or a.dtype == bool else np.int64
    return torch.from_numpy(np.array(a, dtype=dtype, order="C", copy=True))


def _array_batches(x: torch.Tensor, y: torch.Tensor | None, idx: torch.Tensor, batch_size: int) -> Iterable[Any]:
    for start in range(0, len(idx), batch_size):
        sel = idx[start:start + batch_size]
        yield (x[sel],) if y is None else (x[sel], y[sel])


def _dataset_loader(dataset: Any, rank: int, world: int, batch_size: int, *, train: bool, shuffle: bool,
                    seed: int, epoch: int) -> Iterable[Any]:
    from torch.utils.data import DataLoader, Subset
    from torch.utils.data.distributed import DistributedSampler

    if train:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    return DataLoader(Subset(dataset, range(rank, len(dataset), world)), batch_size=batch_size)


def _sync_shard(iterable: Iterable[Any], rank: int, world: int) -> Iterable[Any]:
    for i, batch in enumerate(iterable):
        if i % world == rank:
            yield batch


async def _async_shard(iterable: Any, rank: int, world: int) -> AsyncIterator[Any]:
    i = 0
    async for batch in iterable:
        if i % world == rank:
            yield batch
        i += 1


async def _aenumerate(it: AsyncIterator[Any]) -> AsyncIterator[tuple[int, Any]]:
    i = 0
    async for item in it:
        yield i, item
        i += 1


def _to_device(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


