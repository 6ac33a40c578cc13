"""The Ray Train run: a ``TrainingRun`` (``raymodel.contract``) on a Ray Train V2 worker group.

A one-off run (``Trainable.fit``) and a training server's pool (``raymodel/jobs/_pools/pool.py``) are
this run: the backend's own trainer (``TorchTrainer``, ``XGBoostTrainer``, ...) built from the plan,
Ray's ``RunConfig`` and ``ScalingConfig`` made here, the plan's ``RunEvents`` told through one Ray Train
``UserCallback`` on the run's controller, and Ray's ``Result`` read into a ``RunOutcome``. Ray Train's
callback and result types are used in this module only.

Ray Train's private API (Ray 2.60) is used here once, in ``_without`` (and, for the torch-based
backends' process group, in ``backends/torch/process_group.py``). Train V2 starts helper actors for
every run through its default callbacks, each a process of its own (about 4-6 s of a core each on
2 cores, beside the starting workers, which wait for them). Two are dropped where the run does not
need them:

* the ``DatasetManager`` (``DatasetsCallback``), made with or without Ray Datasets: a run with none
  (every pool, and every one-off run whose data is not a ``ray.data`` Dataset) reads no shard from it;
* the ``PlacementGroupCleaner`` (``PlacementGroupCleanerCallback``), which removes the run's
  placement group if its controller dies: for a pool (``RunPlan.groups_swept``) the training server
  removes them (``jobs/_server/recovery.py``'s sweep).

The public API that is missing is a trainer without those callbacks; check this when Ray is upgraded
(``tests/test_training_run.py``).
"""

from __future__ import annotations

from typing import Any

from ray.train import UserCallback

from raymodel._internal import storage
from raymodel._ray import cluster
from raymodel.contract import RayTrain, RunEvents, RunOutcome, RunPlan, failure_text
from raymodel.exceptions import HookError, TrainingError


class RayTrainRun:
    """A run of ``plan`` on a Ray Train V2 worker group of ``backend``'s trainer."""

    def __init__(self, backend: Any, plan: RunPlan) -> None:
        if not isinstance(backend.training, RayTrain):
            raise TypeError(
                f"the {backend.name} backend's runs are not Ray Train runs (its `training` is no `RayTrain`)"
            )
        self.backend, self.plan = backend, plan
        self.ray_train: RayTrain = backend.training

    def trainer(self, own: bool = False) -> Any:
        """The backend's Ray Train V2 trainer for the plan, not yet fit (``own``: for ``fit``, not a user's)."""
        from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

        plan = self.plan
        keep_best = plan.keep_checkpoints is not None and plan.metric is not None
        run_config = RunConfig(  # type: ignore[call-arg]  # mypy reads ray.train's Train V1 branch
            name=plan.name,
            storage_path=plan.storage,
            failure_config=FailureConfig(max_failures=plan.max_failures),
            checkpoint_config=CheckpointConfig(
                num_to_keep=plan.keep_checkpoints,
                checkpoint_score_attribute=plan.metric if keep_best else None,
                checkpoint_score_order=plan.mode,
            ),
            callbacks=[_Events(plan.events, plan.storage)] if plan.events else None,  # type: ignore[list-item]
            logging_config=LoggingConfig("INFO" if plan.verbose else "WARNING"),
        )
        elastic = {"elastic_resize_monitor_interval_s": plan.elastic_resize_s} if plan.elastic_resize_s else {}
        scaling = ScalingConfig(  # Train V2's (mypy reads ray.train's Train V1 branch): a range, elastic settings
            num_workers=plan.num_workers,  # type: ignore[arg-type]
            use_gpu=plan.use_gpu,
            resources_per_worker=plan.resources_per_worker,
            **elastic,  # type: ignore[arg-type]
        )
        trainer = self.ray_train.make_trainer(
            plan.loop,
            train_loop_config=plan.loop_config,
            scaling_config=scaling,
            run_config=run_config,
            datasets=plan.datasets,
            own=own,
        )
        from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

        unneeded: tuple[type, ...] = () if plan.datasets else (DatasetsCallback,)
        unneeded += (PlacementGroupCleanerCallback,) if plan.groups_swept else ()
        return _without(trainer, unneeded) if unneeded else trainer

    def fit(self) -> RunOutcome:
        from ray.train import TrainingFailedError

        trainer = self.trainer(own=True)
        try:
            with cluster.worker_group_start_timeout(self.plan.elastic_wait_s):
                result = trainer.fit()
        except TrainingFailedError as exc:
            raise TrainingError(f"Training failed on the Ray workers: {_root_message(exc)}") from exc
        except HookError as exc:  # local mode (num_workers=0) raises in this process
            raise TrainingError(f"Training failed: {exc}") from exc
        return self._outcome(result)

    def _outcome(self, result: Any) -> RunOutcome:
        """Ray's ``Result`` as a ``RunOutcome``; its locations keep the storage's scheme (``s3://...``),
        which Ray's drops (``Checkpoint.path`` is a path on its filesystem)."""
        root = self.plan.storage
        kept = [(storage.rebase(root, c.path), dict(m)) for c, m in (result.best_checkpoints or [])]
        return RunOutcome(
            returned=result.return_value or {},
            # A run that reports nothing (a release's scoring run) on an object store has no path of Ray's.
            path=storage.rebase(root, result.path) if result.path else root,
            checkpoint=storage.rebase(root, result.checkpoint.path) if result.checkpoint is not None else None,
            checkpoints=kept,
        )


class _Events(UserCallback):
    """On the run's Train controller: each report's rank-0 row, and each worker failure, to the plan's events."""

    def __init__(self, events: tuple[RunEvents, ...], root: str) -> None:
        self.events, self.root = events, root

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if metrics:
            path = storage.rebase(self.root, checkpoint.path) if checkpoint is not None else None
            for events in self.events:
                events.row(dict(metrics[0]), path)

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        failures = {rank: failure_text(error) for rank, error in worker_exceptions.items()}
        for events in self.events:
            events.workers_failed(dict(failures))


def _without(trainer: Any, unneeded: tuple[type, ...]) -> Any:
    """``trainer`` without those of Train V2's default callbacks that are of the ``unneeded`` types (see
    the module's docstring)."""
    defaults = trainer._create_default_callbacks

    def callbacks() -> list[Any]:
        return [c for c in defaults() if not isinstance(c, unneeded)]

    trainer._create_default_callbacks = callbacks
    return trainer


def _root_message(exc: BaseException) -> str:
    """The user-facing part of a Train V2 failure: the worker's own exception, not Ray's wrapper."""
    worker_failures = getattr(exc, "worker_failures", None)
    if worker_failures:
        rank, error = sorted(worker_failures.items())[0]
        return f"worker {rank}: {type(error).__name__}: {error}"
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
