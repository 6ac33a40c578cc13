"""Where an RLlib run is placed: an actor of raymodel's own, not a Ray Train worker group.

RLlib's learners use Ray Train V1 internals, which a Ray Train V2 worker does not have. So
``RLlibBackend.make_run`` gives an ``AlgorithmRun``: a ``TrainingRun`` (``raymodel.contract``) that runs
the same ``WorkerRun`` lifecycle as any run (hooks, checkpoints, history rows, the stop vote,
``job.update``) in one ``AlgorithmActor``; the Algorithm is built there and its env runners are actors
of their own. Checkpoints go straight into the run's folder (``LocalSession``, which applies
``keep_checkpoints``); each report's row goes to the plan's ``RunEvents`` from the actor.

A killed actor (or its node) is started again, within ``max_failures``, and the run goes on from its
newest complete checkpoint, each iteration once in the history.
"""

from __future__ import annotations

from typing import Any

import ray

from raymodel.contract import RunEvents, RunOutcome, RunPlan, failure_text
from raymodel.exceptions import TrainingError
from raymodel.train import LocalSession, WorkerRun


class _Reported(LocalSession):
    """A ``LocalSession`` that tells the plan's events each report's row and checkpoint."""

    def __init__(self, run_path: str, keep: int | None, events: tuple[RunEvents, ...]) -> None:
        super().__init__(run_path, keep)
        self.events = events

    def deliver(self, row: dict[str, Any]) -> None:
        path = row.pop("checkpoint_path", None)
        for events in self.events:
            events.row(dict(row), path)


class AlgorithmActor:
    """Runs one RLlib training run's ``WorkerRun`` (the Algorithm is built and trained here)."""

    def run(self, plan: RunPlan) -> dict[str, Any]:
        session = _Reported(plan.path, plan.keep_checkpoints, plan.events)
        return WorkerRun(plan.loop_config, session=session).run()


class AlgorithmRun:
    """A run of ``plan`` in an ``AlgorithmActor`` holding ``actor_resources`` (its learner's)."""

    def __init__(self, plan: RunPlan, actor_resources: dict[str, float], env: dict[str, str] | None = None) -> None:
        self.plan = plan
        self.actor_resources = actor_resources
        self.env = env or {}

    def fit(self) -> RunOutcome:
        plan = self.plan
        failures, limit = 0, plan.max_failures
        remote = ray.remote(AlgorithmActor).options(
            name=f"raymodel-algorithm-{plan.name}",
            num_cpus=self.actor_resources.get("CPU", 1.0),
            num_gpus=self.actor_resources.get("GPU", 0.0),
            runtime_env={"env_vars": self.env},  # the env runners it starts inherit it
        )
        while True:
            actor: Any = remote.remote()
            try:
                returned: dict[str, Any] = ray.get(actor.run.remote(plan))
                break
            except ray.exceptions.RayActorError as exc:  # the actor (or its node) died
                failures += 1
                for events in plan.events:
                    events.workers_failed({0: failure_text(exc)})
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
        return RunOutcome.from_storage(plan.path, returned)


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
