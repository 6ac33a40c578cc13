"""The worker side of a training run, shared by every backend.

``WorkerRun`` unpacks what the driver sent (the model class by value, its
config, the settings and the data), builds the model with the setup hooks,
resumes from Ray Train's latest checkpoint after a worker failure, and ends
each epoch the same way for every backend: record the history, write a
checkpoint on rank 0 every ``checkpoint_every`` epochs (and after the last),
and ``ray.train.report`` the metrics from every worker.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from raymodel._internal import checkpoint as ckpt
from raymodel._internal import serialization
from raymodel.hooks import HookRunner, maybe_await


class WorkerRun:
    """One train worker's view of the run."""

    def __init__(self, loop_config: dict[str, Any]) -> None:
        import ray.train

        payload = serialization.loads(loop_config["payload"])
        context = ray.train.get_context()
        self.rank: int = context.get_world_rank()
        self.world: int = context.get_world_size()
        cls, config = serialization.loads(payload["model"])
        self.model = cls(config=config)
        self.backend = self.model.backend
        self.settings = payload["settings"]
        self.data = loop_config["data"]
        self.info: dict[str, Any] = payload.get("info", {})
        self.initial_state: dict[str, bytes] | None = payload.get("initial_state")
        self.hooks = HookRunner(self.model, list(self.settings.callbacks))
        self.history: list[dict[str, Any]] = []
        self.start_epoch = 1

    @property
    def num_epochs(self) -> int:
        return int(self.settings.num_epochs)

    def epochs(self) -> range:
        return range(self.start_epoch, self.num_epochs + 1)

    async def setup_model(self) -> None:
        """``before_setup``, the user's ``setup(config)``, ``after_setup``."""
        await self.hooks.call("before_setup")
        returned = await maybe_await(self.model.setup(self.model.config))
        self.backend.after_user_setup(self.model, returned)
        self.model._is_setup = True
        await self.hooks.call("after_setup")

    def splits(self) -> dict[str, Any]:
        return self.data.materialize(self.model.config)

    async def restore(self) -> dict[str, Any] | None:
        """Load Ray Train's latest checkpoint, if this is a restart; returns the state."""
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return await self._load_initial_state()
        with checkpoint.as_directory() as directory:
            manifest = ckpt.verify(directory)
            state = self.backend.read_state(self.model, Path(directory) / ckpt.STATE_DIR)
        self.backend.set_state(self.model, state)
        await self.hooks.call("on_load_checkpoint", state)
        self.history = list(manifest.get("history", []))
        self.start_epoch = int(manifest.get("epoch", 0)) + 1
        return state

    async def _load_initial_state(self) -> dict[str, Any] | None:
        """Start from the driver instance's weights (e.g. a model from the registry)."""
        if not self.initial_state:
            return None
        with tempfile.TemporaryDirectory(prefix="raymodel-init-") as tmp:
            for rel, data in self.initial_state.items():
                path = Path(tmp) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            state = self.backend.read_state(self.model, Path(tmp))
        self.backend.set_state(self.model, state)
        await self.hooks.call("on_load_checkpoint", state)
        return state

    def wants_checkpoint(self, epoch: int) -> bool:
        return epoch % self.settings.checkpoint_every == 0 or epoch == self.num_epochs

    async def end_epoch(self, epoch: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Record the epoch, checkpoint on rank 0 when due, and report from every worker."""
        import ray.train

        row = {"epoch": epoch, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(row)
        if not self.wants_checkpoint(epoch):
            ray.train.report(row)
            return row
        tmp = None
        checkpoint = None
        if self.rank == 0:
            state = self.backend.get_state(self.model)
            await self.hooks.call("on_save_checkpoint", state)
            tmp = self._checkpoint_dir(epoch)
            ckpt.write(self.model, tmp, state, extra={
                "epoch": epoch, "metrics": row, "history": self.history, "run": self.info,
            })
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
            if self.settings.num_workers == 0:
                tmp = None  # local mode keeps the checkpoint where it was written
        try:
            ray.train.report(row, checkpoint=checkpoint, checkpoint_dir_name=f"checkpoint_epoch_{epoch:06d}")
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        return row

    def _checkpoint_dir(self, epoch: int) -> str:
        """A temporary folder that Ray Train uploads from; in local mode (no workers,
        no upload) the run's own folder."""
        run_dir = self.info.get("path", "")
        if self.settings.num_workers == 0 and run_dir and "://" not in run_dir:
            path = Path(run_dir) / f"checkpoint_epoch_{epoch:06d}"
            path.mkdir(parents=True, exist_ok=True)
            return str(path)
        return tempfile.mkdtemp(prefix="raymodel-ckpt-")

    async def finish(self) -> dict[str, Any]:
        result = {"metrics": self.history[-1] if self.history else {}, "history": self.history}
        await self.hooks.call("after_fit", result)
        return result
