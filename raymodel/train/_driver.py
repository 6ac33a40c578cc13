"""``model.train()`` on the driver: check, build the Ray trainer, run it, collect the result."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from raymodel._internal import runtime, serialization, tmp
from raymodel._internal import checkpoint as ckpt
from raymodel._internal.hub import start_hub, stop_hub
from raymodel.backends._run import run_worker
from raymodel.data import resolve
from raymodel.data._splits import nonfinite
from raymodel.exceptions import DataError, HookError, TrainingError
from raymodel.train._progress import ProgressPrinter
from raymodel.train._result import TrainResult
from raymodel.train._settings import TrainSettings

if TYPE_CHECKING:
    from raymodel.model import RayModel


def prepare(model: "RayModel", settings: Any, data: Any) -> tuple[TrainSettings, Any]:
    """Every check that can fail before Ray is touched: settings, model, data."""
    settings = TrainSettings.coerce(settings)
    backend = model.backend
    backend.import_framework()
    backend.validate_model(model)
    spec = resolve(data)
    backend.validate_data(spec)
    _check_finite(spec, settings.nonfinite)
    return settings, spec


def _check_finite(spec: Any, policy: str) -> None:
    if policy == "allow":
        return
    found = nonfinite(spec)
    if not found:
        return
    message = ("The data holds NaN or infinite values (" + "; ".join(found) + "). A loss over them is NaN. "
               "Clean them, or pass `TrainSettings(nonfinite='allow')` if the model handles them.")
    if policy == "error":
        raise DataError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def run_training(model: "RayModel", settings: TrainSettings | Mapping[str, Any] | None, data: Any, *,
                 extra_callbacks: Sequence[Any] = (), info: dict[str, Any] | None = None,
                 load_result: bool = True) -> TrainResult:
    """Train ``model`` on Ray Train V2 and load the final weights into it.

    Tune calls this same function inside each trial (with its report callback
    in ``extra_callbacks`` and ``load_result=False``).
    """
    settings, spec = prepare(model, settings, data)
    runtime.ensure_ray(settings.verbose)
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

    backend = model.backend
    name = settings.name or runtime.run_name(type(model).__name__)
    storage = settings.storage_path or runtime.runs_root()
    blob = worker_payload(model, settings, {"name": name, "path": _join(storage, name), **(info or {})})
    gathers = settings.num_workers > 1 and not backend.native_collective
    hub = start_hub() if gathers or settings.progress else None
    try:
        # Arrays and the hub travel as Ray objects, which Ray tracks only outside our own pickled blob.
        loop_config = {"payload": blob, "data": spec.for_workers(), "hub": hub}
        keep_best = settings.keep_checkpoints is not None and settings.metric is not None
        run_config = RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=settings.max_failures),
            checkpoint_config=CheckpointConfig(
                num_to_keep=settings.keep_checkpoints,
                checkpoint_score_attribute=settings.metric if keep_best else None,
                checkpoint_score_order=settings.mode,
            ),
            callbacks=list(extra_callbacks),
            logging_config=LoggingConfig("INFO" if settings.verbose else "WARNING"),
        )
        scaling = ScalingConfig(num_workers=settings.num_workers, use_gpu=settings.use_gpu,
                                resources_per_worker=settings.resources_per_worker)
        printer = None
        if settings.progress:
            printer = ProgressPrinter(hub, type(model).__name__, settings.num_epochs, backend.epoch_unit)
            run_config.callbacks.append(printer.callback())
        trainer = backend.make_trainer(run_worker, train_loop_config=loop_config,
                                       scaling_config=scaling, run_config=run_config, datasets=spec.ray_datasets)
        result = _fit(trainer, printer)
    finally:
        stop_hub(hub)
    return _collect(model, settings, result, name, load_result)


def worker_payload(model: "RayModel", settings: TrainSettings, info: dict[str, Any]) -> bytes:
    """What every worker's ``WorkerRun`` unpacks: the class by value, config, settings, the run's
    name and folder, and the instance's current weights when it has any."""
    payload = {
        "model": serialization.dumps((type(model), model.config), type(model)),
        "settings": settings,
        "info": info,
        "initial_state": _initial_state(model),
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


def _collect(model: "RayModel", settings: TrainSettings, result: Any, name: str, load_result: bool) -> TrainResult:
    returned = result.return_value or {}
    history = list(returned.get("history", []))
    checkpoint = result.checkpoint.path if result.checkpoint is not None else None
    if checkpoint is not None and not history:
        with ckpt.local_copy(checkpoint) as directory:
            history = list(ckpt.read_manifest(directory).get("history", []))
    best = None
    if settings.metric is not None:
        best = _best_checkpoint(result, settings.metric, settings.mode, history)
    if load_result and checkpoint is not None:
        model.load_weights(checkpoint)
    return TrainResult(
        metrics=dict(history[-1]) if history else {},
        history=history,
        checkpoint=checkpoint,
        best_checkpoint=best,
        path=result.path,
        config=dict(model.config),
        name=name,
    )


def _best_checkpoint(result: Any, metric: str, mode: str, history: list[dict[str, Any]]) -> str | None:
    scored = [(c, m) for c, m in (result.best_checkpoints or []) if metric in m]
    if not scored:
        reported = sorted({k for row in history for k in row})
        warnings.warn(f"`metric={metric!r}` was never reported, so there is no best checkpoint. "
                      f"Reported metrics: {reported}.", UserWarning, stacklevel=4)
        return None
    pick = min if mode == "min" else max
    return pick(scored, key=lambda cm: cm[1][metric])[0].path


def _join(storage: str, name: str) -> str:
    return f"{storage.rstrip('/')}/{name}"


def _initial_state(model: "RayModel") -> dict[str, bytes] | None:
    """Files of the instance's current state, when it has weights to start from."""
    if not model.is_setup:
        return None
    with tmp.tempdir("init") as staging:
        state = model.backend.get_state(model)
        model.backend.write_state(model, state, staging)
        return {p.relative_to(staging).as_posix(): p.read_bytes() for p in staging.rglob("*") if p.is_file()}


