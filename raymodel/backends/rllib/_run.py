"""Where an RLlib run is placed: an actor of raymodel's own, not a Ray Train worker group.

RLlib's learners use Ray Train V1 internals, which a Ray Train V2 worker does not have. So
``AlgorithmRuns.make_run`` (``RLlibBackend.training``) gives an ``AlgorithmRun``: a ``TrainingRun``
(``raymodel.contract``) that runs the same ``WorkerRun`` lifecycle as any run (hooks, checkpoints,
history rows, the stop vote, ``job.update``) in one ``AlgorithmActor``; the Algorithm is built there and
its env runners are actors of their own. Checkpoints go straight into the run's folder (``LocalSession``, which applies
``keep_checkpoints``); each report's row goes to the plan's ``RunEvents`` from the actor.

A killed actor (or its node) is started again, within ``max_failures``, and the run goes on from its
newest complete checkpoint, each iteration once in the history.

A job's runner (an actor the training server keeps for the next job) keeps the Algorithm's actor of a run
that ended well for its next RLlib run (``_Kept``): the next Algorithm is built in a process that has
RLlib, torch and the learner's modules imported (2-3 s of a core each time on 2 cores, and the process's
start). So that an idle kept actor holds no CPU, a CPU-only run's learner CPU is held by a placement
group of the run's own, for as long as the run, and its actor, which holds none itself, runs on that
group's node; a run with a GPU gets a new actor that holds its GPU, as does a run in any other process.
"""

from __future__ import annotations

import importlib
import threading
import uuid
from typing import Any

import ray

from raymodel._ray import cluster
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
    """Runs one RLlib training run's ``WorkerRun`` (the Algorithm is built and trained here), run after run
    where it is kept."""

    def run(self, plan: RunPlan) -> dict[str, Any]:
        session = _Reported(plan.path, plan.keep_checkpoints, plan.events)
        return WorkerRun(plan.loop_config, session=session).run()

    def node(self) -> str:
        """The node it runs on (and an answer: it is alive)."""
        return str(ray.get_runtime_context().get_node_id())

    def warm(self) -> None:
        """Import ahead what building and training an Algorithm imports (``ALGORITHM_IMPORTS``)."""
        for module in ALGORITHM_IMPORTS:
            try:
                importlib.import_module(module)
            except ImportError:  # the run imports it, and says what is missing
                pass


#: What building a PPO Algorithm of the user's networks and its first update import in its actor: RLlib,
#: its PPO learner and env runner, gymnasium, and ``torch._dynamo`` (the optimizer's first step).
ALGORITHM_IMPORTS = (
    "gymnasium",
    "torch._dynamo",
    "ray.rllib.algorithms.ppo",
    "ray.rllib.algorithms.ppo.torch.ppo_torch_learner",
    "ray.rllib.env.single_agent_env_runner",
    "raymodel.backends.rllib._loop",
    "raymodel.backends.rllib._module",
)


class _Kept:
    """The Algorithm actor a job's runner keeps between runs, and the environment it was started with."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.actor: Any = None
        self.env: dict[str, str] = {}

    def take(self, node: str, env: dict[str, str]) -> Any:
        """The kept actor if it runs on ``node`` with ``env`` and answers (else it is ended); it is no
        longer kept."""
        with self.lock:
            actor, same_env, self.actor = self.actor, self.env == env, None
        if actor is None:
            return None
        try:
            if same_env and ray.get(actor.node.remote(), timeout=120) == node:  # after its imports ahead
                return actor
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        ray.kill(actor)
        return None

    def keep(self, actor: Any, env: dict[str, str]) -> None:
        with self.lock:
            actor, self.actor, self.env = self.actor, actor, env
        if actor is not None:
            ray.kill(actor)

    def ensure(self, env: dict[str, str]) -> None:
        """Keep a new actor, on this process's node, importing ahead (``AlgorithmActor.warm``), unless one
        is kept that has not died (one still importing ahead counts)."""
        with self.lock:
            if self.actor is not None:
                answered, _ = ray.wait([self.actor.node.remote()], timeout=5)
                try:
                    ray.get(answered)  # nothing yet (busy importing), or its node: alive
                    return
                except ray.exceptions.RayActorError:
                    pass
            self.actor, self.env = new_actor(env, num_cpus=0, scheduling_strategy=cluster.on_this_node()), env
            self.actor.warm.remote()


_KEPT = _Kept()


def warm_kept(env: dict[str, str]) -> None:
    """An Algorithm actor kept by this process (a job's runner) for its next run, started now."""
    _KEPT.ensure(env)


def new_actor(env: dict[str, str], name: str = "", **resources: Any) -> Any:
    """A new Algorithm actor named ``raymodel-algorithm-<name>-<id>`` (no name: a kept one's, of no run),
    holding ``resources`` (Ray's actor options: ``num_cpus``, ``scheduling_strategy``, ...)."""
    return (
        ray.remote(AlgorithmActor)
        .options(
            name="-".join(filter(None, ("raymodel-algorithm", name, uuid.uuid4().hex[:8]))),
            runtime_env={"env_vars": env},  # the env runners it starts inherit it
            **resources,
        )
        .remote()
    )


class AlgorithmRun:
    """A run of ``plan`` in an ``AlgorithmActor`` holding ``actor_resources`` (its learner's)."""

    def __init__(self, plan: RunPlan, actor_resources: dict[str, float], env: dict[str, str] | None = None) -> None:
        self.plan = plan
        self.actor_resources = actor_resources
        self.env = env or {}

    def fit(self) -> RunOutcome:
        # Kept by a job's runner (an actor); not by a user's process, where nothing runs next.
        keeps = not self.actor_resources.get("GPU") and ray.get_runtime_context().get_actor_id() is not None
        reserve = ray.util.placement_group([{"CPU": self.actor_resources.get("CPU", 1.0)}]) if keeps else None
        try:
            return RunOutcome.from_storage(self.plan.path, self._attempts(reserve))
        finally:
            if reserve is not None:
                ray.util.remove_placement_group(reserve)

    def _attempts(self, reserve: Any) -> dict[str, Any]:
        plan = self.plan
        failures, limit = 0, plan.max_failures
        while True:
            actor = self._actor(reserve)
            ended_well = False
            try:
                returned: dict[str, Any] = ray.get(actor.run.remote(plan))
                ended_well = True
                return returned
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
                if ended_well and reserve is not None:
                    _KEPT.keep(actor, self.env)  # its Algorithm stopped (``RLlibLoop.close``): the next run's
                else:
                    ray.kill(actor)

    def _actor(self, reserve: Any) -> Any:
        """The run's actor: on ``reserve``'s node, the kept one if it runs there (else a new one, named for
        no run, holding no resources of its own); without ``reserve``, a new one holding the learner's."""
        if reserve is None:
            cpus, gpus = self.actor_resources.get("CPU", 1.0), self.actor_resources.get("GPU", 0.0)
            return new_actor(self.env, self.plan.name, num_cpus=cpus, num_gpus=gpus)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray.get(reserve.ready())  # placed (again, after its node's loss) once the cluster has the CPU
        node = ray.util.placement_group_table(reserve)["bundles_to_node_id"][0]
        kept = _KEPT.take(node, self.env)
        on_node = NodeAffinitySchedulingStrategy(node, soft=False)
        return kept if kept is not None else new_actor(self.env, num_cpus=0, scheduling_strategy=on_node)


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
