"""What the boosted-tree backends share: arrays per worker shard, a round = an epoch.

Hooks a tree backend calls, per worker: ``before_setup, after_setup,
[on_load_checkpoint], before_fit, before_epoch(round), after_epoch(round, metrics),
[on_save_checkpoint], after_fit``. There are no batches and no separate
validation pass (``after_validation`` is called with each round's validation
metrics), so ``before_batch``/``after_batch``/``before_validation`` are not called.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from raymodel._internal import serialization
from raymodel.backends._session import WorkerRun
from raymodel.backends.base import Backend, to_jsonable
from raymodel.data import Arrays, DataSpec, shard_indices
from raymodel.exceptions import DataError, ModelDefinitionError


class TreeBackend(Backend):
    """What XGBoost and LightGBM share: ``self.params`` in, ``self.booster`` out.

    A subclass says how the framework loads a booster (:meth:`load_booster`;
    saving is ``booster.save_model`` in both) and how it predicts.
    """

    epoch_unit = "round"
    required_methods = ("setup",)
    #: The booster's file in the checkpoint's ``state/`` folder.
    booster_file = ""

    def save_booster(self, booster: Any, path: Path) -> None:
        booster.save_model(str(path))  # the same call in XGBoost and LightGBM

    def load_booster(self, path: Path) -> Any:
        raise NotImplementedError("The 'load_booster' method must be implemented.")

    def after_user_setup(self, model: Any, returned: Any) -> None:
        if not isinstance(getattr(model, "params", None), dict):
            raise ModelDefinitionError(f"`{type(model).__name__}.setup` must set `self.params`, the booster's "
                                       "parameter dict (e.g. `{'objective': 'binary'}`).")
        if not hasattr(model, "booster"):
            model.booster = None

    def get_state(self, model: Any) -> dict[str, Any]:
        return {"booster": model.booster}

    def write_state(self, model: Any, state: dict[str, Any], directory: Path) -> None:
        state = dict(state)
        booster = state.pop("booster", None)
        if booster is not None:
            self.save_booster(booster, directory / self.booster_file)  # the framework's own format
        if state:  # entries added by `on_save_checkpoint`
            (directory / "extra.pkl").write_bytes(serialization.dumps(state))

    def read_state(self, model: Any, directory: Path) -> dict[str, Any]:
        path = directory / self.booster_file
        state: dict[str, Any] = {"booster": self.load_booster(path) if path.exists() else None}
        if (directory / "extra.pkl").exists():
            state.update(serialization.loads((directory / "extra.pkl").read_bytes()))
        return state

    def set_state(self, model: Any, state: dict[str, Any]) -> None:
        model.booster = state.get("booster")

    def trained_booster(self, model: Any) -> Any:
        if model.booster is None:
            raise ModelDefinitionError(f"`{type(model).__name__}` has no trained booster yet: train it first.")
        return model.booster

    def validate_data(self, data: DataSpec) -> None:
        bad = [name for name, split in data.splits.items() if not isinstance(split, Arrays)]
        if bad:
            raise DataError(f"The {self.name} backend trains on arrays: pass `rm.data.from_numpy(X, y)`, "
                            f"`rm.data.from_pandas(df, label=...)` or `(X, y)` tuples (split {bad[0]!r} is not).")
        for name, split in data.splits.items():
            if isinstance(split, Arrays) and not hasattr(split.x, "ndim"):
                continue  # object-store refs: a tune trial re-checks data the driver already checked
            if isinstance(split, Arrays) and (split.y is None or split.x.ndim != 2):
                raise DataError(f"The {self.name} backend needs 2-D features and labels "
                                f"(split {name!r} has X of shape {getattr(split.x, 'shape', '?')} "
                                f"and {'no' if split.y is None else 'some'} labels).")

    def preprocess(self, model: Any, payload: Any) -> Any:
        x = np.asarray(payload, dtype=np.float32)
        return x.reshape(1, -1) if x.ndim == 1 else x

    def postprocess(self, model: Any, output: Any) -> Any:
        return to_jsonable(output)


class TreeRun:
    """The worker side of a boosted-tree run: shards, an event loop for the hooks."""

    def __init__(self, loop_config: dict[str, Any]) -> None:
        self.run = WorkerRun(loop_config)
        self.loop = asyncio.new_event_loop()

    def wait(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def shard(self, split: Arrays) -> tuple[np.ndarray, np.ndarray]:
        """This worker's rows (every worker's shard together covers each row once)."""
        run = self.run
        idx = shard_indices(len(split), run.rank, run.world, shuffle=False, seed=0, epoch=0, pad=False)
        return np.asarray(split.x)[idx], np.asarray(split.y)[idx]

    async def end_round(self, epoch: int, metrics: dict[str, float]) -> None:
        hooks = self.run.hooks
        val = {k: v for k, v in metrics.items() if k.startswith("val_")}
        if val:
            await hooks.call("after_validation", val)
        await hooks.call("after_epoch", epoch, metrics)
        await self.run.end_epoch(epoch, metrics)
