"""``Trainable``, behind ``model.train()``: check, build the Ray Train V2 trainer, run it, collect the result."""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from raymodel._internal import checkpoint as ckpt, cluster, locations, serialization, storage, tmp
from raymodel._internal.hub import gathers_through_hub, start_hub, stop_hub
from raymodel.contract import training_server
from raymodel.data import DataSpec, RayDataset, nonfinite, resolve
from raymodel.exceptions import DataError, HookError, SettingsError, TrainingError
from raymodel.train._progress import ProgressPrinter
from raymodel.train._result import TrainResult
from raymodel.train._settings import TrainSettings
from raymodel.train._worker_run import WorkerRun, run_worker

if TYPE_CHECKING:
    from raymodel.contract import Model


def prepare(model: Model, settings: Any, data: Any) -> tuple[TrainSettings, Any]:
    """Every check that can fail before Ray is touched: settings, model, data."""
    settings = TrainSettings.coerce(settings)
    backend = model.backend
    _check_step_settings(settings, backend)
    if settings.elastic and not backend.elastic:
        raise SettingsError(
            f"`num_workers={settings.num_workers!r}`: the {backend.name} backend trains on a fixed number of "
            f"workers (its framework's cluster is set once); elastic ranges work with torch and Lightning. "
            f"Pass an int."
        )
    if settings.strategy != "ddp" and settings.strategy not in backend.strategies:  # "ddp", the default: no sharding
        raise SettingsError(
            f"`strategy={settings.strategy!r}`: the {backend.name} backend does not shard models; "
            f"`strategy='fsdp'` works with the torch and lightning backends. Leave `strategy` at 'ddp'."
        )
    backend.import_framework()
    backend.validate_model(model)
    if not backend.needs_data:
        if data is not None and data != DataSpec():  # (a job's runner is given the empty spec checked here)
            raise DataError(
                f"The {backend.name} backend makes its own data (`{type(model).__name__}.make_env`); leave `data=` out."
            )
        return settings, DataSpec()
    spec = resolve(backend.prepare_data(model, data))
    backend.validate_data(spec)
    _check_finite(spec, settings.nonfinite)
    return settings, spec


def _check_step_settings(settings: TrainSettings, backend: Any) -> None:
    from raymodel.train._settings import STEP_SETTINGS

    if backend.gradient_steps:
        return
    changed = [f"`{k}={getattr(settings, k)!r}`" for k, v in STEP_SETTINGS.items() if getattr(settings, k) != v]
    if changed:
        raise SettingsError(
            f"{', '.join(changed)}: the {backend.name} backend has no gradient steps to change; "
            f"precision, gradient accumulation and clipping are for the torch and Lightning "
            f"backends. Leave them at their defaults."
        )


def _check_finite(spec: Any, policy: str) -> None:
    if policy == "allow":
        return
    found = nonfinite(spec)
    if not found:
        return
    message = (
        "The data holds NaN or infinite values (" + "; ".join(found) + "). A loss over them is NaN. "
        "Clean them, or pass `TrainSettings(nonfinite='allow')` if the model handles them."
    )
    if policy == "error":
        raise DataError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


class Trainable:
    """A model with its training settings and data, checked and ready for Ray Train V2.

    ``fit()`` is ``model.train(settings, data=...)``; ``as_trainer()`` gives the
    native Ray Train trainer of the model's backend (``TorchTrainer``,
    ``TensorflowTrainer``, ``XGBoostTrainer``, ...), not yet fit, for a user who
    runs it inside their own pipeline. Every check runs in the constructor,
    before any Ray resource is taken.

    Args:
        model: A model instance (its current weights, if set up, are the starting point).
        settings: A ``TrainSettings`` or a dict of its fields.
        data: As for ``model.train``.

    Example:
        >>> t = rm.Trainable(model, {"num_workers": 2, "num_epochs": 5}, data=data)
        >>> trainer = t.as_trainer()          # a ray.train.torch.TorchTrainer
        >>> result = trainer.fit()            # Ray's own Result
        >>> again = rm.RayModel.from_checkpoint(result.checkpoint.path)
    """

    def __init__(
        self,
        model: Model,
        settings: TrainSettings | Mapping[str, Any] | None = None,
        *,
        data: Any,
        callbacks: Sequence[Any] = (),
        resume_from: str | None = None,
        hub: Any = None,
        info: dict[str, Any] | None = None,
        control: tuple[Any, str] | None = None,
    ) -> None:
        """``callbacks`` (Ray Train ``UserCallback`` objects on the driver side), ``resume_from``
        (a checkpoint to continue from), ``hub`` and ``info`` are how a Tune trial runs its training;
        ``control``, ``(training server, job id)``, how a job's workers ask the server at each epoch's
        end whether to stop and what changed (``job.update``)."""
        self.model = model
        self.settings, self.spec = prepare(model, settings, data)
        self.name = self.settings.name or locations.run_name(type(model).__name__)
        self.storage = self.settings.storage_path or locations.runs_root()
        self.path = storage.join(self.storage, self.name)
        self._ray_callbacks = list(callbacks)
        self._hub = hub  # the caller's hub (it stops it), used for gathers too
        self._info = {"name": self.name, "path": self.path, **(info or {})}
        recorded = model.backend.input_signature(model, self.spec)
        if recorded is not None:  # recorded in every checkpoint of the run
            self._info["input_signature"] = {"nonfinite": self.settings.nonfinite, **recorded}
        self._control = control
        if resume_from is not None:
            self._info["resume_from"] = resume_from

    def add_callback(self, callback: Any) -> None:
        """One more Ray Train ``UserCallback`` on the run's controller (the training server's rows, say)."""
        self._ray_callbacks.append(callback)

    @property
    def needs(self) -> dict[str, float]:
        """What the run's workers hold in all (an elastic run: at least)."""
        return self.model.backend.run_needs(self.settings)

    def as_trainer(self) -> Any:
        """The native Ray Train V2 trainer for this model's backend, not yet fit.

        Its checkpoints are raymodel checkpoints: load one with
        ``rm.RayModel.from_checkpoint(result.checkpoint.path)``.
        """
        cluster.ensure_ray(self.settings.verbose)
        trainer, hub = self._trainer(printer=None)
        if hub is not None and hub is not self._hub:
            weakref.finalize(trainer, stop_hub, hub)  # the hub lives as long as the trainer
        return trainer

    def fit(self, *, load_result: bool = True) -> TrainResult:
        """Train; afterwards the model holds the final weights (unless ``load_result=False``).

        Raises:
            TrainingError: the run failed on the workers (the message names the worker's exception).
        """
        cluster.ensure_ray(self.settings.verbose)
        training_server().make_room(self.needs)  # idle pools of the training server in the way end first
        printer = None
        if self.settings.progress:
            printer = ProgressPrinter(
                None, type(self.model).__name__, self.settings.num_epochs, self.model.backend.epoch_unit
            )
        trainer, hub = self._trainer(printer)
        try:
            wait_s = self.settings.elastic_wait_s if self.settings.elastic else None
            with cluster.worker_group_start_timeout(wait_s):
                result = _fit(trainer, printer)
        finally:
            if hub is not self._hub:
                stop_hub(hub)
        return _collect(self.model, self.settings, result, self.name, self.storage, load_result)

    def run_on_pool(
        self, pool: Any, job_id: str, server: Any, *, hub: Any = None, deliver: bool = False
    ) -> dict[str, Any]:
        """Run as job ``job_id`` on a pool of the training server (``raymodel.jobs._pools.pool``): the same
        loop config as a one-off run, each ``ray.data`` Dataset split here for the pool's workers.

        Returns ``{"result": TrainResult}`` or ``{"error": ..., "traceback": ...}``, with ``pool_ok``:
        whether the pool can take another job.
        """
        import ray

        settings = self.settings
        data = self.spec.for_workers()
        for name, split in self.spec.splits.items():
            if isinstance(split, RayDataset):  # Ray Train's DataConfig would do this for a run it started
                shards = split.dataset.streaming_split(max(settings.num_workers, 1), equal=True)
                data.splits[name] = RayDataset(split.key, shards=shards)
        spec = {
            "loop_config": {
                "payload": worker_payload(self.model, settings, self._info),
                "data": data,
                "hub": hub,
                "control": self._control,
            },
            "server": server,
            "path": self.path,
            "max_failures": settings.max_failures,
            "keep_checkpoints": settings.keep_checkpoints,
            "metric": settings.metric,
            "mode": settings.mode,
            "deliver": deliver,
            "model_class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
        }
        outcome = ray.get(pool.run_job.remote({"id": job_id, "spec": spec}))
        if outcome.get("error"):
            return outcome
        history = list(outcome["result"].get("history", []))
        return {"result": self._collect_stored(history), "pool_ok": outcome.get("pool_ok", True)}

    def _collect_stored(self, history: list[dict[str, Any]]) -> TrainResult:
        """The ``TrainResult`` of a run on a pool, from its storage: the newest checkpoint, and the best
        by ``metric`` among the ones kept (what Ray's ``Result`` gives for a one-off run)."""
        settings, path = self.settings, self.path
        epochs = sorted(e for e in (ckpt.epoch_of(n) for n in storage.listdir(path)) if e is not None)
        location = {e: storage.join(path, f"checkpoint_epoch_{e:06d}") for e in epochs}
        best = None
        metric = settings.metric
        if metric is not None:
            rows = {int(r.get("epoch", 0)): r for r in history}
            scored = [e for e in epochs if metric in rows.get(e, {})]
            if scored:
                pick = min if settings.mode == "min" else max
                best = location[pick(scored, key=lambda e: float(rows[e][metric]))]
            else:
                _never_reported(metric, history)
        return TrainResult(
            metrics=dict(history[-1]) if history else {},
            history=history,
            checkpoint=location[epochs[-1]] if epochs else None,
            best_checkpoint=best,
            path=path,
            config=dict(self.model.config),
            name=self.name,
        )

    def run_here(self, session: Any) -> dict[str, Any]:
        """Run the training loop in this process, placed by ``session`` (one worker): the same
        ``WorkerRun`` lifecycle as on a Ray Train worker, without a worker group. A Tune trial
        with one worker trains this way, in the trial itself."""
        loop_config = {
            "payload": worker_payload(self.model, self.settings, self._info),
            "data": self.spec.for_workers(),
            "hub": None,
        }
        return WorkerRun(loop_config, session=session).run()

    def _trainer(self, printer: ProgressPrinter | None) -> tuple[Any, Any]:
        from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

        settings, backend = self.settings, self.model.backend
        gathers = gathers_through_hub(backend, settings.max_workers)
        hub = self._hub or (start_hub() if gathers or printer is not None else None)
        # Arrays and the hub travel as Ray objects, which Ray tracks only outside our own pickled blob.
        loop_config = {
            "payload": worker_payload(self.model, settings, self._info),
            "data": self.spec.for_workers(),
            "hub": hub,
            "control": self._control,
        }
        keep_best = settings.keep_checkpoints is not None and settings.metric is not None
        callbacks = list(self._ray_callbacks)
        if printer is not None:
            printer.hub = hub
            callbacks.append(printer.callback())
        run_config = RunConfig(  # type: ignore[call-arg]  # mypy reads ray.train's Train V1 branch
            name=self.name,
            storage_path=self.storage,
            failure_config=FailureConfig(max_failures=settings.max_failures),
            checkpoint_config=CheckpointConfig(
                num_to_keep=settings.keep_checkpoints,
                checkpoint_score_attribute=settings.metric if keep_best else None,
                checkpoint_score_order=settings.mode,
            ),
            callbacks=callbacks,
            logging_config=LoggingConfig("INFO" if settings.verbose else "WARNING"),
        )
        elastic = {"elastic_resize_monitor_interval_s": settings.elastic_resize_s} if settings.elastic else {}
        scaling = ScalingConfig(  # Train V2's (mypy reads ray.train's Train V1 branch): a range, elastic settings
            num_workers=settings.num_workers,  # type: ignore[arg-type]
            use_gpu=settings.use_gpu,
            resources_per_worker=settings.resources_per_worker,
            **elastic,  # type: ignore[arg-type]
        )
        trainer = backend.make_trainer(
            run_worker,
            train_loop_config=loop_config,
            scaling_config=scaling,
            run_config=run_config,
            datasets=self.spec.ray_datasets,
        )
        return trainer, hub

    def __repr__(self) -> str:
        return f"Trainable({type(self.model).__name__}, num_workers={self.settings.num_workers}, name={self.name!r})"


def worker_payload(model: Model, settings: TrainSettings, info: dict[str, Any]) -> bytes:
    """What every worker's ``WorkerRun`` unpacks: the class by value, config, settings, the run's
    name and folder, and the instance's current weights when it has any."""
    payload = {
        "model": serialization.dumps((type(model), model.config), type(model)),
        "settings": settings,
        "info": info,
        "initial_state": initial_state(model),
    }
    return serialization.dumps(payload, type(model), *settings.callbacks)


def _fit(trainer: Any, printer: ProgressPrinter | None) -> Any:
    from ray.train import TrainingFailedError

    try:
        if printer is None:
            return trainer.fit()
        with printer:
            return trainer.fit()
    except TrainingFailedError as exc:
        raise TrainingError(f"Training failed on the Ray workers: {_root_message(exc)}") from exc
    except HookError as exc:  # local mode (num_workers=0) raises in this process
        raise TrainingError(f"Training failed: {exc}") from exc


def _root_message(exc: BaseException) -> str:
    """The user-facing part of a Train V2 failure: the worker's own exception, not Ray's wrapper."""
    worker_failures = getattr(exc, "worker_failures", None)
    if worker_failures:
        rank, error = sorted(worker_failures.items())[0]
        return f"worker {rank}: {type(error).__name__}: {error}"
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__


def _collect(
    model: Model, settings: TrainSettings, result: Any, name: str, root: str, load_result: bool
) -> TrainResult:
    """The run's ``TrainResult``; its locations keep the storage's scheme (``s3://...``), which
    Ray's ``Result`` drops (``Checkpoint.path`` is a path on its filesystem)."""
    returned = result.return_value or {}
    history = list(returned.get("history", []))
    checkpoint = storage.rebase(root, result.checkpoint.path) if result.checkpoint is not None else None
    if checkpoint is not None and not history:
        with ckpt.local_copy(checkpoint) as directory:
            history = list(ckpt.read_manifest(directory).get("history", []))
    best = None
    if settings.metric is not None:
        best = _best_checkpoint(result, settings.metric, settings.mode, history)
        best = storage.rebase(root, best) if best is not None else None
    if load_result and checkpoint is not None:
        model.load_weights(checkpoint)
    return TrainResult(
        metrics=dict(history[-1]) if history else {},
        history=history,
        checkpoint=checkpoint,
        best_checkpoint=best,
        path=storage.rebase(root, result.path),
        config=dict(model.config),
        name=name,
    )


def _best_checkpoint(result: Any, metric: str, mode: str, history: list[dict[str, Any]]) -> str | None:
    scored = [(c, m) for c, m in (result.best_checkpoints or []) if metric in m]
    if not scored:
        _never_reported(metric, history)
        return None
    pick = min if mode == "min" else max
    return pick(scored, key=lambda cm: cm[1][metric])[0].path


def _never_reported(metric: str, history: list[dict[str, Any]]) -> None:
    reported = sorted({k for row in history for k in row})
    warnings.warn(
        f"`metric={metric!r}` was never reported, so there is no best checkpoint. Reported metrics: {reported}.",
        UserWarning,
        stacklevel=5,
    )


def initial_state(model: Model) -> dict[str, bytes] | None:
    """Files of the instance's current state, when it has weights to start from (a run's workers,
    or a job's runner, load them before the first epoch)."""
    if not model.is_setup:
        return None
    with tmp.tempdir("init") as staging:
        state = model.backend.get_state(model)
        model.backend.write_state(model, state, staging)
        return {p.relative_to(staging).as_posix(): p.read_bytes() for p in staging.rglob("*") if p.is_file()}
