"""``Trainable``, behind ``model.train()``: check, plan the run, build the backend's run type, fit it,
collect the result (a Ray Train run, ``_ray_train_run.py``; or the backend's own, RLlib's Algorithm)."""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from raymodel._internal import locations, serialization, storage, tmp
from raymodel._ray import cluster
from raymodel.contract import (
    OwnRuns,
    RayTrain,
    RunEvents,
    RunOutcome,
    RunPlan,
    TrainingRun,
    checkpoint as ckpt,
    training_server,
)
from raymodel.data import DataSpec, RayDataset, nonfinite, resolve
from raymodel.exceptions import DataError, ModelDefinitionError, SettingsError
from raymodel.train._hub import gathers_through_hub, start_hub, stop_hub
from raymodel.train._methods import with_config
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
    if settings.method is not None and settings.method.kind not in backend.methods:
        raise SettingsError(
            f"`method={type(settings.method).__name__}(...)` post-trains a language model: a "
            f"`RayTransformersModel` (a causal LM, with `lora` or not); `{type(model).__name__}` is a "
            f"{backend.name} model. Leave `method` out."
        )
    if settings.method is not None:  # the config's `beta`, `num_generations` (a tune's sample) over the method's
        settings = dataclasses.replace(settings, method=with_config(settings.method, model.config))
    backend.import_framework()
    backend.validate_model(model)
    if not backend.needs_data:
        if data is not None and data != DataSpec():  # (a job's runner is given the empty spec checked here)
            raise DataError(
                f"The {backend.name} backend makes its own data (`{type(model).__name__}.make_env`); leave `data=` out."
            )
        return settings, DataSpec()
    with backend.seeded(settings.seed):  # a model set up here starts from the same weights for a seed
        if settings.method is not None:
            spec = resolve(backend.prepare_method_data(model, data, settings.method))
        else:
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


def with_parent(model: Any, info: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's ``info`` with the registry version the model was loaded from as its ``parent`` (its checkpoints
    record it, and a version registered from them names it in its lineage)."""
    source = getattr(model, "source", None)
    parent = source.get("registry") if isinstance(source, dict) else None
    return {**({"parent": parent} if parent else {}), **(info or {})}


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
        events: Sequence[RunEvents] = (),
        resume_from: str | None = None,
        hub: Any = None,
        info: dict[str, Any] | None = None,
        control: tuple[Any, str] | None = None,
    ) -> None:
        """``events`` (told each report's row and each failure, ``raymodel.contract.RunEvents``), ``resume_from``
        (a checkpoint to continue from), ``hub`` and ``info`` are how a Tune trial runs its training;
        ``control``, ``(training server, job id)``, how a job's workers ask the server at each epoch's
        end whether to stop and what changed (``job.update``)."""
        self.model = model
        self.settings, self.spec = prepare(model, settings, data)
        self.name = self.settings.name or locations.run_name(type(model).__name__)
        self.storage = self.settings.storage_path or locations.runs_root()
        self.path = storage.join(self.storage, self.name)
        self._events = list(events)
        self._hub = hub  # the caller's hub (it stops it), used for gathers too
        self._info = {"name": self.name, "path": self.path, **with_parent(model, info)}
        recorded = model.backend.input_signature(model, self.spec)
        if recorded is not None:  # recorded in every checkpoint of the run
            self._info["input_signature"] = {"nonfinite": self.settings.nonfinite, **recorded}
        self._control = control
        if resume_from is not None:
            self._info["resume_from"] = resume_from

    def add_events(self, events: RunEvents) -> None:
        """One more follower of the run's rows and failures (the training server's, say)."""
        self._events.append(events)

    @property
    def needs(self) -> dict[str, float]:
        """What the run's workers hold in all (an elastic run: at least)."""
        return self.model.backend.training.needs(self.settings)

    def as_trainer(self) -> Any:
        """The native Ray Train V2 trainer for this model's backend, not yet fit.

        Its checkpoints are raymodel checkpoints: load one with
        ``rm.RayModel.from_checkpoint(result.checkpoint.path)``.
        """
        if not isinstance(self.model.backend.training, RayTrain):
            raise ModelDefinitionError(
                f"`{type(self.model).__name__}` trains with the {self.model.backend.name} backend, whose runs are "
                "not Ray Train runs (the Algorithm trains in an actor of raymodel's): there is no Ray Train "
                "trainer to give. Call `fit()` (or `model.train(...)`) instead."
            )
        cluster.ensure_ray(self.settings.verbose)
        from raymodel.train._ray_train_run import RayTrainRun  # imports ray.train (a second), which only a run needs

        plan, hub = self._plan(printer=None)
        trainer = RayTrainRun(self.model.backend, plan).trainer()
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
        plan, hub = self._plan(printer)
        run = self._run(plan)
        try:
            if printer is None:
                outcome = run.fit()
            else:
                with printer:
                    outcome = run.fit()
        finally:
            if hub is not self._hub:
                stop_hub(hub)
        return _collect(self.model, self.settings, outcome, self.name, load_result)

    def evaluate(self, location: str) -> dict[str, float]:
        """The figures of the checkpoint at ``location`` (a run's, or a registry version's) on the data's
        validation split, scored in the cluster by a run of these settings' workers that does not train
        (``train/_evaluate.py``): ``{"val_acc": ..., ...}``. A release's gate scores both sides so."""
        cluster.ensure_ray(self.settings.verbose)
        training_server().make_room(self.needs)
        self._info["evaluate"] = location
        try:
            plan, hub = self._plan(printer=None)
            try:
                outcome = self._run(plan).fit()
            finally:
                if hub is not self._hub:
                    stop_hub(hub)
        finally:
            del self._info["evaluate"]
        return {k: float(v) for k, v in outcome.returned.get("metrics", {}).items()}

    def _run(self, plan: RunPlan) -> TrainingRun:
        """The backend's run type for ``plan``: a Ray Train run, or the backend's own (``OwnRuns.make_run``)."""
        from raymodel.train._ray_train_run import RayTrainRun  # imports ray.train (a second), which only a run needs

        backend = self.model.backend
        if isinstance(backend.training, OwnRuns):
            return backend.training.make_run(plan)
        return RayTrainRun(backend, plan)

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
        stored = RunOutcome.from_storage(self.path, {"history": history})  # the pool applied keep_checkpoints
        return {
            "result": _collect(self.model, self.settings, stored, self.name, False),
            "pool_ok": outcome.get("pool_ok", True),
        }

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

    def _plan(self, printer: ProgressPrinter | None) -> tuple[RunPlan, Any]:
        """The run's plan, and the hub its rows and gathers go through (``None``: none needed)."""
        settings, backend = self.settings, self.model.backend
        gathers = gathers_through_hub(backend, settings.max_workers)
        hub = self._hub or (start_hub() if gathers or printer is not None else None)
        events = list(self._events)
        if printer is not None:
            printer.hub = hub
            events.append(printer.events())
        plan = RunPlan(
            name=self.name,
            storage=self.storage,
            loop=run_worker,
            # Arrays and the hub travel as Ray objects, which Ray tracks only outside our own pickled blob.
            loop_config={
                "payload": worker_payload(self.model, settings, self._info),
                "data": self.spec.for_workers(),
                "hub": hub,
                "control": self._control,
            },
            num_workers=settings.num_workers,
            use_gpu=settings.use_gpu,
            resources_per_worker=settings.resources_per_worker,
            max_failures=settings.max_failures,
            keep_checkpoints=settings.keep_checkpoints,
            metric=settings.metric,
            mode=settings.mode,
            elastic_resize_s=settings.elastic_resize_s if settings.elastic else None,
            elastic_wait_s=settings.elastic_wait_s if settings.elastic else None,
            datasets=self.spec.ray_datasets or None,
            events=tuple(events),
            verbose=settings.verbose,
        )
        return plan, hub

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


def _collect(model: Model, settings: TrainSettings, outcome: RunOutcome, name: str, load_result: bool) -> TrainResult:
    """The run's ``TrainResult``: its rows (from the newest checkpoint's manifest when rank 0 returned
    none), the newest checkpoint, and the best by ``metric`` among the ones kept."""
    history = list(outcome.returned.get("history", []))
    checkpoint = outcome.checkpoint
    if checkpoint is not None and not history:
        with ckpt.local_copy(checkpoint) as directory:
            history = list(ckpt.read_manifest(directory).get("history", []))
    best, metric = None, settings.metric
    if metric is not None:
        scored = [(c, float(row[metric])) for c, row in outcome.checkpoints if metric in row]
        if scored:
            pick = min if settings.mode == "min" else max
            best = pick(scored, key=lambda scored_checkpoint: scored_checkpoint[1])[0]
        else:
            _never_reported(metric, history)
    if load_result and checkpoint is not None:
        model.load_weights(checkpoint)
    return TrainResult(
        metrics=dict(history[-1]) if history else {},
        history=history,
        checkpoint=checkpoint,
        best_checkpoint=best,
        path=outcome.path,
        config=dict(model.config),
        name=name,
    )


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
