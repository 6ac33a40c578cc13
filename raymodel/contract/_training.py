"""A backend's training (``Backend.training``): the loop each worker runs, and how a run of it is built.

Two kinds, and a backend declares one:

* ``RayTrain``: a run is a Ray Train V2 worker group of ``trainer`` (every built-in backend but RLlib's).
  It carries the trainer's class and options, raymodel's own trainer where that differs (torch's), and
  whether the loop gathers across workers with the framework's own collective.
* ``OwnRuns``: a run of a type of the backend's own (RLlib's Algorithm in an actor, ``make_run``), and
  where a Tune trial of it places its actors (``trial_bundles``). It has no trainer and no collective.

A driver asks for the kind it needs (``isinstance(backend.training, RayTrain)``); a backend of the other
kind does not carry its members.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import TYPE_CHECKING, Any, Callable, TypeAlias

from raymodel.exceptions import ModelDefinitionError

if TYPE_CHECKING:
    from raymodel.contract._training_run import RunPlan, TrainingRun

__all__ = ["DATA_PARALLEL", "OwnRuns", "RayTrain", "Training", "worker_resources"]

#: Ray Train V2's trainer of a worker group that runs any function (raymodel's own runs, by default).
DATA_PARALLEL = "ray.train.v2.api.data_parallel_trainer.DataParallelTrainer"

#: A ``WorkerLoop``: its class as ``"module:Class"`` (imported on the worker, not where the backend is
#: defined), or a callable that makes it from the run (a ``RunOnWorker``).
LoopMaker: TypeAlias = "str | Callable[[Any], Any]"


@dataclasses.dataclass(frozen=True)
class Training:
    """What every kind of run shares: the backend's ``WorkerLoop``, made on each worker for its run."""

    loop: LoopMaker

    def __post_init__(self) -> None:
        if not callable(self.loop) and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", str(self.loop)):
            raise ModelDefinitionError(
                f"a backend's worker loop must be a callable or its class as 'module:Class' "
                f"(e.g. 'my_plugin.loop:MyLoop'); got {self.loop!r}"
            )

    def worker_loop(self, run: Any) -> Any:
        """The ``WorkerLoop`` that trains ``run``'s model (its ``RunOnWorker``) on this worker."""
        if callable(self.loop):
            return self.loop(run)
        module, _, name = self.loop.partition(":")
        return getattr(importlib.import_module(module), name)(run)

    def needs(self, settings: Any) -> dict[str, float]:
        """What a run of ``settings`` holds in all while it trains (an elastic run: at least)."""
        per_worker = worker_resources(settings.resources_per_worker, settings.use_gpu)
        return {k: v * max(settings.min_workers, 1) for k, v in per_worker.items()}


@dataclasses.dataclass(frozen=True)
class RayTrain(Training):
    """Runs that are a Ray Train V2 worker group of ``trainer`` (``"module.Class"``).

    ``collective``: the worker loop gathers across workers with the framework's own collective
    (``WorkerLoop.all_gather``); otherwise the run's hub actor carries the values."""

    trainer: str = DATA_PARALLEL
    collective: bool = False

    def options(self) -> dict[str, Any]:
        """The backend's own keyword arguments for its ``trainer`` (none by default)."""
        return {}

    def own(self, scaling_config: Any) -> tuple[str, dict[str, Any]] | None:
        """The trainer class and its options for raymodel's own runs, where not ``trainer``'s (``None``)."""
        return None

    def worker_env(self, env_vars: dict[str, str]) -> dict[str, str]:
        """The environment variables of each worker, given the run's own (``env_vars`` of its runtime env):
        what the framework needs set before the trainer's own set-up imports it (none by default)."""
        return env_vars

    def make_trainer(
        self,
        train_loop: Callable[[dict[str, Any]], Any],
        *,
        train_loop_config: dict[str, Any],
        scaling_config: Any,
        run_config: Any,
        datasets: dict[str, Any] | None,
        own: bool = False,
    ) -> Any:
        """The Ray Train V2 trainer, not fit: ``trainer`` with ``options()``; ``own()``'s if any for
        raymodel's own run (``own``: ``fit``'s, not ``as_trainer()``'s)."""
        mine = self.own(scaling_config) if own else None
        runtime_env = dict(run_config.worker_runtime_env or {})
        env_vars = self.worker_env(dict(runtime_env.get("env_vars") or {}))
        if env_vars:
            run_config.worker_runtime_env = {**runtime_env, "env_vars": env_vars}
        name, options = mine or (self.trainer, self.options())
        module, _, cls_name = name.rpartition(".")
        return getattr(importlib.import_module(module), cls_name)(
            train_loop,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets or None,
            **options,
        )


@dataclasses.dataclass(frozen=True)
class OwnRuns(Training):
    """Runs of a type of the backend's own, not Ray Train worker groups (RLlib's Algorithm in an actor)."""

    def make_run(self, plan: RunPlan) -> TrainingRun:
        """The run of ``plan``."""
        raise NotImplementedError("The 'make_run' method must be implemented.")

    def trial_bundles(self, num_workers: int, use_gpu: bool) -> list[dict[str, float]]:
        """The placement group of a Tune trial of it, which starts its actors from the trial's process
        (the first bundle)."""
        raise NotImplementedError("The 'trial_bundles' method must be implemented.")

    def needs(self, settings: Any) -> dict[str, float]:
        """What a Tune trial's bundles hold, added up."""
        needs: dict[str, float] = {}
        for bundle in self.trial_bundles(settings.num_workers, settings.use_gpu):
            for k, v in bundle.items():
                needs[k] = needs.get(k, 0.0) + v
        return needs


def worker_resources(resources_per_worker: Any, use_gpu: bool) -> dict[str, float]:
    """What one training worker holds: ``resources_per_worker`` (1 CPU by default), a GPU with ``use_gpu``."""
    resources = dict(resources_per_worker or {"CPU": 1.0})
    return {**resources, "GPU": resources.get("GPU", 1.0)} if use_gpu else resources
