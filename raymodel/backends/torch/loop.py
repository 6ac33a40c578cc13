"""The worker side of ``RayTorchModel``: devices, DDP, optimization, LR schedulers, metrics.

``WorkerRun`` owns the lifecycle; this loop trains one epoch and evaluates.
The next batch is always loaded in the background while the current one is
processed; synchronous steps are called directly, ``async def`` ones awaited.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from raymodel.backends.torch import fsdp
from raymodel.backends.torch.arrays import array_batches
from raymodel.backends.torch.optim import configure_optimizers, set_hyperparameters
from raymodel.backends.torch.step import StepControl, with_last
from raymodel.contract import WorkerLoop, batch_len
from raymodel.data import (
    Arrays,
    Batches,
    RayDataset,
    TorchDataset,
    aprefetch,
    aworker_batches,
    prefetch,
    worker_batches,
    worker_rows,
)
from raymodel.exceptions import HookError, ModelDefinitionError
from raymodel.hooks import maybe_await

if TYPE_CHECKING:
    from raymodel.contract import RunOnWorker


class TorchLoop(WorkerLoop):
    """Trains one worker's replica of a ``RayTorchModel``."""

    #: The user's model: its networks, optimizers or booster are attributes that its ``setup`` and this loop set.
    model: Any

    def __init__(self, run: RunOnWorker) -> None:
        super().__init__(run)
        self.device = _device(run.settings.use_gpu)
        self.distributed = run.world > 1 and dist.is_available() and dist.is_initialized()
        self.step_module: nn.Module | None = None
        self.control = StepControl(run.settings, self.device)
        self.fsdp = getattr(run.settings, "strategy", "ddp") == "fsdp"
        self.epoch = 0
        self.fresh: list[list[dict[str, Any]]] = []  # the config's hyperparameters per param group (build)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def build(self) -> None:
        model = self.model
        modules = model.backend.modules(model)
        for m in modules.values():
            m.to(self.device)
        if self.fsdp:  # before the optimizers: they must hold the sharded parameters
            if not (dist.is_available() and dist.is_initialized()):
                raise ModelDefinitionError("`strategy='fsdp'` needs Ray Train's process group; none was set up.")
            model._fsdp_roots = fsdp.shard(model, modules, self.run.settings, self.device)
            self.control.dtype = None  # bf16-mixed is FSDP's mixed-precision policy, not autocast
        model._optimizers, model._scheduler_configs = configure_optimizers(model)
        model._schedulers = [c.scheduler for c in model._scheduler_configs]
        self.fresh = [  # before any checkpoint is loaded
            [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in model._optimizers
        ]
        self.control.modules = list(model.backend.modules(model).values())
        model._step_control = self.control
        if not model.automatic_optimization and self.control.scaler is not None:
            raise ModelDefinitionError(
                "`precision='16-mixed'` needs automatic optimization (its gradient scaler "
                "steps the optimizers); with `automatic_optimization = False` use "
                "`precision='bf16-mixed'`."
            )

    def ready(self) -> None:
        self.step_module = self._wrap(self.model.backend.modules(self.model))

    def set_state(self, state: dict[str, Any]) -> None:
        """Weights, optimizers and schedulers; when the config changed since the checkpoint (PBT's
        exploit), each optimizer keeps the hyperparameters (``lr``, ...) the new config gave it."""
        super().set_state(state)  # (a sharded checkpoint is in already: `read_state` loaded the shards)
        if self.run.config_changed:
            for opt, groups in zip(self.model._optimizers, self.fresh):
                for group, hyper in zip(opt.param_groups, groups):
                    group.update(hyper)

    def apply_config(self, changes: dict[str, Any]) -> None:
        set_hyperparameters(self.model._optimizers, changes)

    # ------------------------------------------------------------ training
    def _wrap(self, modules: dict[str, nn.Module]) -> nn.Module | None:
        """DDP over a module whose forward is the user's ``train_step`` (automatic
        optimization); with manual optimization, only broadcast rank 0's weights."""
        if not self.distributed or self.fsdp:
            return None  # FSDP's hooks on the modules gather weights and reduce-scatter gradients
        if not self.model.automatic_optimization:
            for m in modules.values():
                for tensor in list(m.parameters()) + list(m.buffers()):
                    dist.broadcast(tensor.data, src=0)
            return None
        from torch.nn.parallel import DistributedDataParallel

        step = _StepModule(self.model, modules)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(step, device_ids=device_ids)

    async def train_epoch(self, epoch: int) -> dict[str, float]:
        model, run = self.model, self.run
        self.epoch = epoch
        for m in model.backend.modules(model).values():
            m.train()
        auto = model.automatic_optimization
        optimizers = model._optimizers
        per_step = [c for c in model._scheduler_configs if c.interval == "step"]
        step = self.step_module if self.step_module is not None else model.train_step
        sums: dict[str, torch.Tensor] = {}
        n_batches = 0
        control = self.control
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        async for batch_idx, batch, last in with_last(self._batches("train", epoch)):
            batch = await run.before_batch(_to_device(batch, self.device), batch_idx)
            # The optimizers step every `accumulate_grad_batches` batches and after the epoch's last one;
            # in between, DDP keeps the gradients local (no all-reduce) and they add up.
            due = last or (batch_idx + 1) % control.every == 0
            model._step_due = due
            with self._no_sync(auto and not due):
                with control.autocast():
                    outputs = await _call_step(step, batch, "train_step")
                loss = _loss_of(outputs)
                if auto:
                    control.backward(loss)
            if auto and due:
                control.step(optimizers)
            if due or not auto:
                for config in per_step:
                    config.step()
            _accumulate(sums, outputs, loss)
            n_batches += 1
            await run.after_batch(batch_idx, outputs)
        return run.mean_over_workers({k: (float(v), n_batches) for k, v in sums.items()})

    def _no_sync(self, accumulating: bool) -> Any:
        if self.fsdp:
            fsdp.set_gradient_sync(self.model._fsdp_roots, not accumulating)
            return contextlib.nullcontext()
        if accumulating and isinstance(self.step_module, nn.parallel.DistributedDataParallel):
            return self.step_module.no_sync()
        return contextlib.nullcontext()

    def batches_per_epoch(self) -> int | None:
        split, s = self.run.splits["train"], self.run.settings
        if isinstance(split, Arrays):
            rows = len(
                worker_rows(len(split), self.run.rank, self.run.world, train=True, shuffle=False, seed=0, epoch=0)
            )
            return -(-rows // s.batch_size)
        if isinstance(split, TorchDataset):
            return -(-len(split.dataset) // (s.batch_size * self.run.world))
        return None

    def end_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        for config in self.model._scheduler_configs:
            if config.interval == "epoch":
                config.step(metrics)

    def get_state(self) -> dict[str, Any]:
        """FSDP: every worker writes its shard (``_torch_fsdp.save_shards``); rank 0's state holds the
        folder of all of them, and the LR schedulers."""
        if not self.fsdp:
            return super().get_state()
        model = self.model
        folder = fsdp.save_shards(self.run, model.backend.modules(model), model._optimizers, self.epoch)
        if folder is None:
            return {}
        return {"sharded": folder, "schedulers": [s.state_dict() for s in model._schedulers]}

    # ---------------------------------------------------------- validation
    async def validate(self, epoch: int) -> dict[str, float]:
        model = self.model
        modules = model.backend.modules(model).values()
        for m in modules:
            m.eval()
        sums: dict[str, tuple[float, int]] = {}
        batches = self._batches("valid", epoch)
        # FSDP: every forward is a collective, so the workers take the same number of steps.
        steps = _in_step(batches, self.device) if self.fsdp else _counted(batches)
        with torch.no_grad():
            async for batch, counted in steps:
                batch = _to_device(batch, self.device)
                out = await maybe_await(model.validation_step(batch))
                if out is None or not counted:
                    continue
                if isinstance(out, torch.Tensor):
                    out = {"val_loss": out}
                if not isinstance(out, dict):
                    raise ModelDefinitionError(
                        f"`validation_step` must return a dict of metrics or a loss tensor (got {type(out).__name__})."
                    )
                n = batch_len(batch)
                for key, value in out.items():
                    s, c = sums.get(key, (0.0, 0))
                    sums[key] = (s + float(value) * n, c + n)
        for m in modules:
            m.train()
        return self.run.mean_over_workers(sums)

    def all_gather(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.run.world
        dist.all_gather_object(gathered, value)
        return gathered

    # ----------------------------------------------------------- RNG state
    def rng_state(self) -> Any:
        state = {"cpu": torch.get_rng_state().numpy()}
        if torch.cuda.is_available() and self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device).numpy()
        return state

    def set_rng_state(self, state: Any) -> None:
        torch.set_rng_state(torch.from_numpy(np.asarray(state["cpu"])))
        if "cuda" in state and torch.cuda.is_available() and self.device.type == "cuda":
            torch.cuda.set_rng_state(torch.from_numpy(np.asarray(state["cuda"])), self.device)

    # ---------------------------------------------------------------- data
    async def _batches(self, split_name: str, epoch: int) -> AsyncIterator[Any]:
        split, train = self.run.splits[split_name], split_name == "train"
        rank, world = self.run.rank, self.run.world
        if isinstance(split, Batches) and split.is_async:
            async for batch in aprefetch(aworker_batches(split.iterable, rank, world, train=train)):
                yield batch
            return
        for batch in prefetch(self._sync_batches(split, train, epoch)):
            yield batch

    def _sync_batches(self, split: Any, train: bool, epoch: int) -> Iterable[Any]:
        rank, world, s = self.run.rank, self.run.world, self.run.settings
        if isinstance(split, Arrays):  # the object store's arrays, read in place: a copy of each batch only
            idx = worker_rows(len(split), rank, world, train=train, shuffle=s.shuffle, seed=s.seed, epoch=epoch)
            return array_batches(split.x, split.y, idx, s.batch_size)
        if isinstance(split, TorchDataset):
            from torch.utils.data import DataLoader

            sampler = ShardSampler(len(split.dataset), rank, world, train=train, shuffle=s.shuffle, seed=s.seed)
            sampler.set_epoch(epoch)
            return DataLoader(split.dataset, batch_size=s.batch_size, sampler=sampler)
        if isinstance(split, RayDataset):
            return split.shard(rank).iter_torch_batches(batch_size=s.batch_size)
        if isinstance(split, Batches):
            return worker_batches(split.iterable, rank, world, train=train)
        raise TypeError(f"Unsupported split {type(split).__name__}")


class ShardSampler(torch.utils.data.Sampler):
    """A torch ``Sampler`` over this worker's rows, by raymodel's one sharding policy
    (``raymodel.data.worker_rows``); ``set_epoch`` reshuffles."""

    def __init__(self, n: int, rank: int, world: int, *, train: bool, shuffle: bool, seed: int) -> None:
        self.n, self.rank, self.world, self.train, self.shuffle, self.seed = n, rank, world, train, shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _rows(self) -> np.ndarray:
        return worker_rows(
            self.n, self.rank, self.world, train=self.train, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows().tolist())

    def __len__(self) -> int:
        return len(self._rows())


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


async def _counted(batches: AsyncIterator[Any]) -> AsyncIterator[tuple[Any, bool]]:
    async for batch in batches:
        yield batch, True


async def _in_step(batches: AsyncIterator[Any], device: torch.device) -> AsyncIterator[tuple[Any, bool]]:
    """``(batch, counted)`` in step with every other worker: a worker whose shard ran out forwards
    its last batch again, not counted, until every worker is done, so FSDP's gathers all match."""
    it, last = batches.__aiter__(), None
    while True:
        batch = await anext(it, None)
        have = torch.tensor([0 if batch is None else 1], device=device)
        dist.all_reduce(have, op=dist.ReduceOp.MAX)
        if not have.item():
            return
        if batch is not None:
            last = batch
            yield batch, True
        elif last is not None:
            yield last, False
        else:
            raise ModelDefinitionError(
                "A worker's validation shard is empty while others still validate; with "
                "`strategy='fsdp'` every worker needs at least one validation row (fewer workers, or more rows)."
            )


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
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


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


def _device(use_gpu: bool) -> torch.device:
    """The worker's device: Ray Train's choice on a train worker, else the first visible GPU or the CPU."""
    if not use_gpu:
        return torch.device("cpu")
    try:
        import ray.train.torch

        return ray.train.torch.get_device()
    except Exception:  # noqa: BLE001 - not on a Ray Train worker
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


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
