"""``WorkerRun``: the lifecycle of a training run on one worker, the same for every backend.

One place carries out the hook order of ``raymodel.hooks``::

    setup hooks -> [restore the newest complete checkpoint, on_load_checkpoint]
    -> before_fit -> per epoch: before_epoch, (the backend's epoch), before_validation,
       (the backend's validation), after_validation, after_epoch, stop vote,
       [on_save_checkpoint], report -> after_fit

The backend's ``WorkerLoop`` does the work inside
each step; a framework with its own fit loop (Lightning) calls the same phase
methods from that framework's callbacks, and a phase called out of order is
an error, so every backend keeps the order by construction.

Async hooks and steps run on the run's event loop; framework code that runs
in a thread (Keras ``fit``, Lightning's ``Trainer``) reaches it through
``WorkerRun.sync``, the one bridge between the two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import shutil
from pathlib import Path
from typing import Any, Awaitable, Iterator

import numpy as np

from raymodel._internal import serialization, storage, tmp
from raymodel.contract import RayTrain, checkpoint as ckpt
from raymodel.exceptions import CheckpointError
from raymodel.hooks import HookRunner, RunContext, maybe_await
from raymodel.train._changes import JobChanges
from raymodel.train._evaluate import evaluate
from raymodel.train._hub import Collective
from raymodel.train._progress import BatchProgress
from raymodel.train._session import TrainSession

# Which phase may follow which: a backend that calls them out of order is a bug.
_NEXT = {
    "fit": ("epoch", "done"),  # "done" at once: resumed from the last epoch's checkpoint
    "epoch": ("validation", "epoch_end"),
    "validation": ("validated",),
    "validated": ("epoch_end", "evaluated"),  # "evaluated": a run that only scores (train/_evaluate.py)
    "epoch_end": ("epoch", "done"),
    "evaluate": ("validation",),
}


def run_worker(loop_config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker`` of every backend's Ray trainer."""
    return WorkerRun(loop_config).run()


class WorkerRun:
    """One worker's training run: unpacks the driver's payload and runs the lifecycle."""

    def __init__(self, loop_config: dict[str, Any], session: Any = None) -> None:
        payload = serialization.loads(loop_config["payload"])
        self.session = session or TrainSession()
        self.rank, self.world = self.session.rank, self.session.world
        cls, config = serialization.loads(payload["model"])
        self.model = cls(config=config)
        self.backend = self.model.backend
        self.model.input_signature = payload.get("info", {}).get("input_signature")
        self.settings = payload["settings"]
        self.info: dict[str, Any] = payload.get("info", {})
        self.initial_state: dict[str, bytes] | None = payload.get("initial_state")
        self.data = loop_config["data"]
        gather_hub = loop_config.get("gather_hub") or loop_config.get("hub")  # a pool's own, or the run's
        self.collective = Collective(gather_hub, self.rank, self.world, self.session.broadcast, self.session.barrier)
        self.context = RunContext(
            rank=self.rank,
            world_size=self.world,
            local_rank=self.session.local_rank,
            num_epochs=int(self.settings.num_epochs),
            name=self.info.get("name", ""),
            storage_path=self.info.get("path", ""),
            trial_id=self.info.get("trial_id"),
            settings=self.settings,
        )
        self.model.context = self.context
        self.callbacks = list(self.settings.callbacks)
        self.hooks = HookRunner(self.model, self.callbacks, self.context)
        self.history: list[dict[str, Any]] = []
        #: The training server's control of this run (stop, preempt, ``job.update``'s changes), if a job's.
        self.job = JobChanges(loop_config.get("control"))
        self.start_epoch = 1
        self.config_changed = False
        self.splits: dict[str, Any] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.worker: Any = None  # the backend's WorkerLoop, made in `fit`
        self._phase = "created"
        self.last_checkpoint: str | None = None  # the newest this run wrote (``after_fit`` gets it)
        hub = loop_config.get("hub")
        self.progress = BatchProgress(hub) if hub is not None and self.rank == 0 and self.settings.progress else None
        self._batches_per_epoch: int | None = None

    @property
    def num_epochs(self) -> int:
        return int(self.settings.num_epochs)

    async def _apply_changes(self, changes: list[dict[str, Any]]) -> None:
        """Apply ``job.update``'s changes from the next epoch on: settings, then the config (merged into
        ``model.config``; the backend sets what it can, e.g. the optimizers' ``lr``), then the hook."""
        settings, config = self.job.apply(changes)
        self._set_settings(settings)
        if config:
            self.model.config.update(config)
            self.worker.apply_config(config)
            await self.hooks.call("on_config_update", dict(config))

    def _set_settings(self, settings: dict[str, Any]) -> None:
        if not settings:
            return
        self.settings = dataclasses.replace(self.settings, **settings)
        self.context.settings, self.context.num_epochs = self.settings, self.num_epochs
        self.session.settings_changed(self.settings)
        self.worker.settings_changed()

    # ------------------------------------------------------------ lifecycle
    def run(self) -> dict[str, Any]:
        return asyncio.run(self.fit())

    async def fit(self) -> dict[str, Any]:
        """The whole run on this worker; returns ``{"metrics": ..., "history": ...}``."""
        self.loop = asyncio.get_running_loop()
        self.worker = self.backend.training.worker_loop(self)
        try:
            return await self._fit()
        finally:
            self.worker.close()

    async def _fit(self) -> dict[str, Any]:
        if isinstance(self.backend.training, RayTrain) and self.backend.training.collective:
            self.collective.native = self.worker.all_gather
        seed = int(self.settings.seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.worker.seed(seed)
        with self.worker.setup_scope():
            await self._setup_model()
        self.splits = self.data.materialize(self.model.config)
        if self.data.module is not None or self.data.module_blob is not None:
            self.backend.validate_data(type(self.data)(self.splits))  # what a data module returned
        self.worker.build()
        if self.info.get("evaluate"):  # a release's gate: score a checkpoint, no training
            return await evaluate(self, self.info["evaluate"])
        await self._restore()
        self.worker.ready()
        if self.job.control is not None:  # changes made while the job waited (queued, or preempted)
            control = self.collective.all_gather(self.job.ask(self.start_epoch - 1) if self.rank == 0 else None)[0]
            if (control or {}).get("changes"):
                await self._apply_changes(control["changes"])
        await self.hooks.call("before_fit")
        self._phase = "fit"
        if self.start_epoch <= self.num_epochs:
            await self.worker.run_epochs(self.start_epoch, self.num_epochs)
        self._enter("done")
        result = {"metrics": self.history[-1] if self.history else {}, "history": self.history}
        await self.hooks.call("after_fit", {**result, "checkpoint": self.last_checkpoint})
        return result

    async def epoch(self, epoch: int) -> bool:
        """One epoch of a loop-driven backend; True when the run stops after it."""
        await self.begin_epoch(epoch)
        metrics = await self.worker.train_epoch(epoch)
        if self.worker.has_validation:
            await self.begin_validation()
            metrics.update(await self.end_validation(await self.worker.validate(epoch)))
        return await self.end_epoch(epoch, metrics)

    # --------------------------------------------------------------- phases
    async def begin_epoch(self, epoch: int) -> None:
        self._enter("epoch")
        self.context.epoch = epoch
        await self.hooks.call("before_epoch", epoch)

    async def before_batch(self, batch: Any, batch_idx: int) -> Any:
        if self.hooks.has("before_batch"):
            return await self.hooks.before_batch(batch, batch_idx)
        return batch

    async def after_batch(self, batch_idx: int, outputs: Any) -> None:
        if self.progress is not None:
            if batch_idx == 0:
                self._batches_per_epoch = self.worker.batches_per_epoch()
            self.progress.batch(self.context.epoch, batch_idx, self._batches_per_epoch, outputs)
        if self.hooks.has("after_batch"):
            await self.hooks.call("after_batch", batch_idx, outputs)

    async def begin_validation(self) -> None:
        self._enter("validation")
        await self.hooks.call("before_validation")

    async def end_validation(self, metrics: dict[str, Any]) -> dict[str, float]:
        self._enter("validated")
        metrics = {k if k.startswith("val_") else f"val_{k}": float(v) for k, v in metrics.items()}
        await self.hooks.call("after_validation", metrics)
        return metrics

    async def end_epoch(self, epoch: int, metrics: dict[str, Any]) -> bool:
        """``after_epoch``, the stop vote, the checkpoint when due, the report; True to stop."""
        self._enter("epoch_end")
        metrics = {k: float(v) for k, v in metrics.items() if k != "epoch"}
        await self.hooks.call("after_epoch", epoch, metrics)
        self.worker.end_epoch(epoch, metrics)
        row = {"epoch": epoch, **metrics}
        if self.settings.elastic:
            row["world_size"] = self.world
        tag = self.job.take_tag()
        if tag is not None:
            row["changes"] = tag
        self.history.append(row)
        control = self.job.ask(epoch) if self.rank == 0 else None
        votes = self.collective.all_gather((self.context.should_stop, self._rng_state(), control))
        control = votes[0][2] or {}
        if control.get("changes"):  # every worker applies rank 0's answer: the same epoch boundary
            await self._apply_changes(control["changes"])
        stop = (any(vote for vote, _, _ in votes) or bool(control.get("stop"))) and epoch < self.num_epochs
        self.context.should_stop = stop
        due = stop or epoch % self.settings.checkpoint_every == 0 or epoch >= self.num_epochs
        directory = None
        if due:
            state = self.worker.get_state()  # on every worker: some frameworks save collectively
            if self.rank == 0:
                directory = await self._write_checkpoint(epoch, state, row, [rng for _, rng, _ in votes])
        if self.progress is not None and self.settings.num_workers == 0 and self.session.in_worker_group:
            import ray  # local mode: no controller forwards the report; the row is in before fit() returns

            ray.get(self.progress.hub.push.remote(row))
        try:
            self.session.report(row, directory, f"checkpoint_epoch_{epoch:06d}")
            if due and self.info.get("path"):
                self.last_checkpoint = storage.join(self.info["path"], f"checkpoint_epoch_{epoch:06d}")
        finally:
            if directory is not None and not self._keeps_checkpoint_dirs:
                shutil.rmtree(directory, ignore_errors=True)
        if due and self.world > 1:
            self.collective.barrier()  # rank 0's upload is done: no worker starts an epoch before it is stored
        return stop

    def _enter(self, phase: str) -> None:
        if phase not in _NEXT.get(self._phase, ()):
            raise RuntimeError(
                f"The {self.backend.name} backend moved from `{self._phase}` to `{phase}`; "
                "a WorkerLoop must follow WorkerRun's phase order."
            )
        self._phase = phase

    # ----------------------------------------------------- async/sync bridge
    def sync(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` on the run's event loop from a framework's thread, and wait for it."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(_wrap(awaitable), self.loop).result()

    # ----------------------------------------------------------- reduction
    def all_gather(self, value: Any) -> list[Any]:
        """Every worker's ``value``, by rank (a collective: every worker calls it)."""
        return self.collective.all_gather(value)

    def mean_over_workers(self, sums: dict[str, tuple[float, int]]) -> dict[str, float]:
        """``{name: (sum, count)}`` of this worker -> the mean over every worker's counts."""
        totals: dict[str, list[float]] = {}
        for part in self.collective.all_gather(dict(sums)):
            for key, (s, n) in part.items():
                acc = totals.setdefault(key, [0.0, 0.0])
                acc[0] += float(s)
                acc[1] += float(n)
        return {k: s / n for k, (s, n) in sorted(totals.items()) if n}

    # -------------------------------------------------------------- setup
    async def _setup_model(self) -> None:
        """``before_setup``, the user's ``setup(config)``, ``after_setup``."""
        await self.hooks.call("before_setup")
        returned = await maybe_await(self.model.setup(self.model.config))
        self.backend.after_user_setup(self.model, returned)
        self.model._is_setup = True
        await self.hooks.call("after_setup")

    # ---------------------------------------------------------- checkpoints
    async def _restore(self) -> None:
        """Continue from the newest complete checkpoint of this run, else from the driver's weights."""
        for location, opener in self._resume_candidates():
            with opener() as directory:
                try:
                    manifest = ckpt.verify(directory)
                except CheckpointError:
                    continue  # an upload cut short by a failure: try the one before
                state = ckpt.read_state(self.model, directory)
                run_state = ckpt.read_run_state(directory)
            self.start_epoch = int(manifest.get("epoch", 0)) + 1
            settings, replayed = self.job.replay(manifest.get("changes") or [], self.start_epoch)
            self._set_settings(settings)  # job.update's, before the checkpoint
            self.model.config.update(replayed)
            # Another config than the checkpoint's (PBT's exploit): the optimizers keep the new hyperparameters.
            self.config_changed = manifest.get("config") != ckpt.plain_json(dict(self.model.config))
            self.worker.set_state(state)
            self._load_run_state(run_state)
            self.history = [dict(row) for row in manifest.get("history", [])]
            if self.job.control is not None and self.rank == 0:  # the job's rows: the checkpoint's, then new ones
                import ray

                server, job_id = self.job.control
                ray.get(server.restored.remote(job_id, self.history))
            self.context.resumed_from = self.start_epoch - 1
            self.context.checkpoint = location
            await self.hooks.call("on_load_checkpoint", state)
            if replayed:
                self.worker.apply_config(replayed)
                await self.hooks.call("on_config_update", replayed)
            return
        if self.info.get("resume_from"):
            raise CheckpointError(
                f"Cannot resume from `{self.info['resume_from']}`: it is not a complete "
                "checkpoint any more (was it deleted, e.g. by `keep_checkpoints`?)."
            )
        if self.initial_state:
            state = ckpt.state_from_files(self.model, self.initial_state)
            self.backend.set_state(self.model, state)
            await self.hooks.call("on_load_checkpoint", state)

    def _resume_candidates(self) -> Iterator[tuple[str, Any]]:
        """Checkpoints to resume from, newest first, as ``(location, opener)``: the run's storage, the
        one Ray hands back, or (for a trial Tune restarted) the one Tune handed back.

        Train V2's controller takes in a report only when it polls, so after a
        failure it may hand back an older checkpoint than the run wrote:
        storage, where raymodel's manifest marks a checkpoint complete, decides.
        """
        found: dict[str, tuple[str, Any]] = {}
        run_path = self.info.get("path")
        if run_path:
            for name in storage.listdir(run_path):
                if ckpt.epoch_of(name) is not None:
                    location = storage.join(run_path, name)
                    found[name] = (location, _opener(location))
        given = self.session.latest_checkpoint()
        if given is not None:
            found.setdefault(Path(given.path).name, (given.path, given.as_directory))
        for name in sorted(found, key=lambda n: ckpt.epoch_of(n) or 0, reverse=True):
            yield found[name]
        resume_from = self.info.get("resume_from")
        if resume_from and not found:
            yield resume_from, _opener(resume_from)

    async def _write_checkpoint(self, epoch: int, state: dict[str, Any], row: dict[str, Any], rngs: list[Any]) -> str:
        await self.hooks.call("on_save_checkpoint", state)
        directory = self._checkpoint_dir(epoch)
        run_state = {"callbacks": [(type(cb).__qualname__, cb.state_dict()) for cb in self.callbacks], "rng": rngs}
        ckpt.write(
            self.model,
            directory,
            state,
            run_state=run_state,
            extra={
                "epoch": epoch,
                "metrics": row,
                "history": self.history,
                "run": self.info,
                "changes": self.job.applied,
                **({"steps": steps} if (steps := self.worker.step_rows()) else {}),
            },
        )
        return directory

    @property
    def _keeps_checkpoint_dirs(self) -> bool:
        """Ray Train's local mode (``num_workers=0``) does not upload: it keeps what it is given."""
        return self.settings.num_workers == 0 and "://" not in self.info.get("path", "://")

    def _checkpoint_dir(self, epoch: int) -> str:
        if self._keeps_checkpoint_dirs:
            path = Path(self.info["path"]) / f"checkpoint_epoch_{epoch:06d}"
            path.mkdir(parents=True, exist_ok=True)
            return str(path)
        return str(tmp.make("ckpt"))

    # ------------------------------------------------------------------ RNG
    def _rng_state(self) -> dict[str, Any]:
        return {"python": random.getstate(), "numpy": np.random.get_state(), "framework": self.worker.rng_state()}

    def _load_run_state(self, run_state: dict[str, Any] | None) -> None:
        if not run_state:
            return
        saved = list(run_state.get("callbacks") or [])
        for callback in self.callbacks:  # each takes the next saved state of its own class
            match = next((i for i, (name, _) in enumerate(saved) if name == type(callback).__qualname__), None)
            if match is not None:
                callback.load_state_dict(saved.pop(match)[1])
        rngs = run_state.get("rng") or []
        if rngs:
            rng = rngs[self.rank % len(rngs)]
            random.setstate(rng["python"])
            np.random.set_state(rng["numpy"])
            if rng.get("framework") is not None:
                self.worker.set_rng_state(rng["framework"])


async def _wrap(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _opener(uri: str) -> Any:
    return lambda: ckpt.local_copy(uri)
