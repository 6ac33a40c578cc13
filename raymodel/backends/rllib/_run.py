"""Where an RLlib run is placed: an actor of raymodel's own, not a Ray Train worker group.

RLlib's learners use Ray Train V1 internals, which a Ray Train V2 worker does not have. So
``RLlibBackend.make_trainer`` gives ``AlgorithmRun``, which takes the same arguments as a Ray Train
trainer and runs the same ``WorkerRun`` lifecycle (hooks, checkpoints, history rows, the stop vote,
``job.update``) in one ``AlgorithmActor``; the Algorithm is built there and its env runners are actors
of their own. Checkpoints go straight into the run's storage (``LocalSession``); each report goes to
the run's Ray Train callbacks (progress, the training server's rows) as Ray Train would send it.

A killed actor (or its node) is started again, within ``FailureConfig.max_failures``, and the run goes
on from its newest complete checkpoint, each iteration once in the history.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ray

from raymodel._internal import checkpoint as ckpt, storage
from raymodel.exceptions import TrainingError
from raymodel.train import LocalSession, WorkerRun


class _Reported(LocalSession):
    """Hands each report to the run's Ray Train callbacks (``after_report``), as Train V2's controller would."""

    def __init__(self, run_path: str, keep: int | None, callbacks: list[Any]) -> None:
        super().__init__(run_path, keep)
        self.callbacks = callbacks

    def deliver(self, row: dict[str, Any]) -> None:
        path = row.pop("checkpoint_path", None)
        checkpoint = _Checkpoint(path) if path else None
        for callback in self.callbacks:
            callback.after_report(None, [row], checkpoint)


@dataclasses.dataclass
class _Checkpoint:
    """What a callback reads of a reported checkpoint (Ray's ``Checkpoint.path``)."""

    path: str


class AlgorithmActor:
    """Runs one RLlib training run's ``WorkerRun`` (the Algorithm is built and trained here)."""

    def run(self, loop_config: dict[str, Any], path: str, keep: int | None, callbacks: list[Any]) -> dict[str, Any]:
        return WorkerRun(loop_config, session=_Reported(path, keep, callbacks)).run()


@dataclasses.dataclass
class AlgorithmResult:
    """The parts of Ray Train's ``Result`` that raymodel reads."""

    return_value: dict[str, Any]
    checkpoint: _Checkpoint | None
    path: str
    best_checkpoints: list[tuple[_Checkpoint, dict[str, Any]]]


class AlgorithmRun:
    """A Ray Train trainer's stand-in for RLlib: ``fit()`` runs the ``WorkerRun`` in an ``AlgorithmActor``."""

    def __init__(
        self,
        train_loop_config: dict[str, Any],
        scaling_config: Any,
        run_config: Any,
        actor_resources: dict[str, float],
        env: dict[str, str] | None = None,
    ) -> None:
        self.loop_config, self.run_config = train_loop_config, run_config
        self.scaling_config = scaling_config
        self.actor_resources = actor_resources
        self.env = env or {}
        self.path = storage.join(run_config.storage_path, run_config.name)

    def fit(self) -> AlgorithmResult:
        failures, limit = 0, self.run_config.failure_config.max_failures
        keep = self.run_config.checkpoint_config.num_to_keep
        remote = ray.remote(AlgorithmActor).options(
            name=f"raymodel-algorithm-{self.run_config.name}",
            num_cpus=self.actor_resources.get("CPU", 1.0),
            num_gpus=self.actor_resources.get("GPU", 0.0),
            runtime_env={"env_vars": self.env},  # the env runners it starts inherit it
        )
        while True:
            actor: Any = remote.remote()
            try:
                returned: dict[str, Any] = ray.get(
                    actor.run.remote(self.loop_config, self.path, keep, self.run_config.callbacks)
                )
                break
            except ray.exceptions.RayActorError as exc:  # the actor (or its node) died
                failures += 1
                for callback in self.run_config.callbacks:  # as Ray Train tells of failed workers
                    callback.after_exception(None, {0: exc})
                if limit != -1 and failures > limit:
                    raise TrainingError(
                        f"Training failed: the Algorithm's actor died ({_cause(exc)}) {failures} time(s), "
                        f"more than `max_failures={limit}` allows."
                    ) from exc
            except ray.exceptions.RayTaskError as exc:
                error = exc.cause if exc.cause is not None else exc
                raise TrainingError(f"Training failed: {type(error).__name__}: {error}") from exc
            finally:
                ray.kill(actor)
        return self._result(returned)

    def _result(self, returned: dict[str, Any]) -> AlgorithmResult:
        history = list(returned.get("history", []))
        rows = {int(r.get("epoch", 0)): r for r in history}
        epochs = sorted(e for e in (ckpt.epoch_of(n) for n in storage.listdir(self.path)) if e is not None)
        found = [(_Checkpoint(storage.join(self.path, f"checkpoint_epoch_{e:06d}")), rows.get(e, {})) for e in epochs]
        return AlgorithmResult(
            return_value=returned,
            checkpoint=found[-1][0] if found else None,
            path=self.path,
            best_checkpoints=found,
        )


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
