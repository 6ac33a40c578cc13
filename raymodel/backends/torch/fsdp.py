"""``strategy="fsdp"`` for ``RayTorchModel``: PyTorch's FSDP2 (``fully_shard``) over the run's
workers, and sharded checkpoints with ``torch.distributed.checkpoint`` (DCP).

Sharding: each unit of ``shard_modules()`` becomes an FSDP unit, then each of the
model's module attributes as a whole (the root). The mesh is the run's own
process group, so a pool's next job finds no extra process group behind.

A checkpoint's ``state/sharded/`` folder is one DCP checkpoint: every worker
writes its shard (``__<rank>_0.distcp``), rank 0 the ``.metadata``. Workers
other than rank 0 pass their files to rank 0 through the run's storage
(``<run>/.shards/``); rank 0 writes the checkpoint, whose manifest lists every
shard with its checksum. A run resumed on any number of workers loads its own
shares (DCP reshards on load); a process with no process group (``predict``,
``serve``, the registry) loads the whole model, consolidated once per node and
checkpoint (``whole_state``).
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterable, cast

import torch
import torch.distributed as dist
from torch import nn

from raymodel._internal import storage, tmp
from raymodel.exceptions import ModelDefinitionError

SHARDED_DIR = "sharded"  # inside a checkpoint's state/ folder


def shard_units(model: Any, modules: dict[str, nn.Module]) -> list[nn.Module]:
    """The model's ``shard_modules()``, checked; by default every direct child that holds parameters."""
    chosen = model.shard_modules()
    if chosen is None:
        return [child for m in modules.values() for child in m.children() if any(True for _ in child.parameters())]
    chosen = list(chosen)
    inside = {id(sub) for m in modules.values() for sub in m.modules()}
    bad = [c for c in chosen if not isinstance(c, nn.Module) or id(c) not in inside]
    if bad:
        raise ModelDefinitionError(
            f"`{type(model).__name__}.shard_modules()` must return submodules of the modules `setup` created "
            f"(got {bad[0]!r})."
        )
    return chosen


def shard(model: Any, modules: dict[str, nn.Module], settings: Any, device: torch.device) -> list[nn.Module]:
    """``fully_shard`` the units, then every module attribute; rank 0's initial weights on every worker.

    Returns the roots (the module attributes), which hold the FSDP state.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    for m in modules.values():  # the same start as DDP's: rank 0's weights
        for tensor in list(m.parameters()) + list(m.buffers()):
            dist.broadcast(tensor.data, src=0)
    world = dist.group.WORLD
    if world is None:
        raise RuntimeError("FSDP needs torch.distributed's process group; it is not initialized on this worker.")
    mesh = DeviceMesh.from_group(world, device.type)
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if settings.precision == "bf16-mixed"
        else MixedPrecisionPolicy()
    )
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": policy}
    for unit in shard_units(model, modules):
        fully_shard(unit, reshard_after_forward=settings.reshard_after_forward, **kwargs)
    roots = list(modules.values())
    for root in roots:
        fully_shard(root, **kwargs)
    return roots


def set_gradient_sync(roots: Iterable[nn.Module], sync: bool) -> None:
    """Off between the batches a gradient accumulation adds up (no reduce-scatter), on for the step's."""
    from torch.distributed.fsdp import FSDPModule

    for root in roots:
        cast(FSDPModule, root).set_requires_gradient_sync(sync)  # `shard` made each root an FSDPModule


# ------------------------------------------------------------------ checkpoints
def _root(modules: dict[str, nn.Module]) -> nn.Module:
    return nn.ModuleDict(modules)  # FQNs "<attribute>.<parameter>" across the module attributes


def save_shards(run: Any, modules: dict[str, nn.Module], optimizers: list[Any], epoch: int) -> Path | None:
    """Every worker writes its shard of the weights and optimizer state; rank 0 returns a folder holding
    every worker's files (the others come through the run's storage), the others None."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(_root(modules), optimizers)
    folder = tmp.make("shards")
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=dcp.FileSystemWriter(str(folder)))
    staging = storage.join(run.info["path"], ".shards", f"epoch_{epoch:06d}")
    if run.rank != 0:
        _put(folder, storage.join(staging, f"rank{run.rank}"))
        shutil.rmtree(folder, ignore_errors=True)
    run.all_gather(None)  # every shard is in storage
    if run.rank != 0:
        return None
    for rank in range(1, run.world):
        _get(storage.join(staging, f"rank{rank}"), folder)
    storage.delete(staging)
    if not storage.is_uri(staging):  # an object store has no empty folders to leave behind
        with contextlib.suppress(OSError):
            storage.local_path(staging).parent.rmdir()
    return folder


def _put(folder: Path, location: str) -> None:
    if storage.is_uri(location):
        storage.upload(folder, location)
    else:
        shutil.copytree(folder, storage.local_path(location), dirs_exist_ok=True)


def _get(location: str, folder: Path) -> None:
    if storage.is_uri(location):
        storage.download(location, folder)
    else:
        shutil.copytree(storage.local_path(location), folder, dirs_exist_ok=True)


def load_shards(directory: Path, modules: dict[str, nn.Module], optimizers: list[Any]) -> None:
    """Load this worker's share of a sharded checkpoint (any number of workers wrote it) in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    root = _root(modules)
    model_sd, optim_sd = get_state_dict(root, optimizers)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(directory)))
    set_state_dict(root, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_whole_into_shards(whole: dict[str, dict[str, Any]], modules: dict[str, nn.Module]) -> None:
    """Whole weights (``{attribute: state_dict}``, on every worker) into the sharded modules."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    flat = {f"{name}.{k}": v for name, sd in whole.items() for k, v in sd.items()}
    set_model_state_dict(_root(modules), flat, options=StateDictOptions(full_state_dict=True))


def whole_state(state_dir: Path, key: str) -> dict[str, dict[str, Any]]:
    """The whole weights of a sharded checkpoint as ``{attribute: state_dict}``, in a process with no
    process group; consolidated once per node and checkpoint (``key``: its manifest's sha256)."""
    cache = tmp.root() / "whole" / f"{key}.pt"
    if not cache.is_file():
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

        with warnings.catch_warnings():  # "no process group: loading in a single process" is the point
            warnings.simplefilter("ignore", UserWarning)
            flat = _load_state_dict_from_keys({"model"}, checkpoint_id=str(state_dir / SHARDED_DIR))["model"]
        cache.parent.mkdir(parents=True, exist_ok=True)
        staged = cache.with_name(f".{cache.name}.{tmp.owned_name('whole')}")
        torch.save(flat, staged)
        staged.replace(cache)  # whole or absent: a replica never reads half a file
    flat = torch.load(cache, map_location="cpu", weights_only=True)
    whole: dict[str, dict[str, Any]] = {}
    for fqn, tensor in flat.items():
        name, _, rest = fqn.partition(".")
        whole.setdefault(name, {})[rest] = tensor
    return whole
