"""``JobRunner``: the actor that runs one job at a time for the training server; ``Runners``: the
server's part that keeps them (one per running job, and a spare whose imports are done for the next)."""

from __future__ import annotations

import importlib
import threading
import traceback
from typing import Any, Sequence

import ray

from raymodel._ray import cluster, remote
from raymodel.jobs._address import NAMESPACE


def new_runner(
    imports: Sequence[str] = (), calls: Sequence[str] = (), runtime_env: dict[str, Any] | None = None
) -> Any:
    """A runner that imports what every job needs, and ``imports``, and makes ``calls``, while it waits
    for its job; ``runtime_env``: its job's (``remote.job_env``), which its processes inherit."""
    runner: Any = JobRunnerActor.options(
        namespace=NAMESPACE,
        max_concurrency=8,
        scheduling_strategy=cluster.on_this_node(),
        runtime_env=remote.with_job_env(runtime_env or {}),
    ).remote()
    runner.warm.remote(tuple(imports), tuple(calls))
    return runner


class JobRunner:
    """Runs a job at a time: the blocking verb, in this actor (its workers push rows to the server)."""

    def __init__(self) -> None:
        self.job_id = ""
        self.stop_event = threading.Event()
        self.server: Any = None
        self.warming = threading.Lock()  # a job starts once the imports ahead are in (or not begun)

    def warm(self, imports: tuple[str, ...] = (), calls: tuple[str, ...] = ()) -> None:
        """Import what every job needs, and look the server up, before a job arrives; then ``imports``:
        the frameworks of the server's warm pools, which a job's payload imports as it is unpickled
        (torch: about 1 s of the first job on a warm pool, before any of its epochs). A job that arrives
        meanwhile waits for them: a framework imported by two threads at once can fail (transformers'
        lazy module: "cannot import name 'PreTrainedTokenizerFast'"). ``calls`` (``"module:function"``,
        ``WarmUp.runner_call``) start what a job of a backend without pools starts (RLlib's Algorithm
        actor), kept by this process for its next job, first; a runner used before makes them again."""
        with self.warming:
            for call in calls:
                module, _, function = call.partition(":")
                try:
                    getattr(importlib.import_module(module), function)()
                except Exception:  # noqa: BLE001 - the job starts what it needs itself
                    pass
            if self.job_id:  # a job came first (a second call, late): it imports what it needs itself
                return
            import raymodel.jobs._server.execute
            import raymodel.train
            import raymodel.tune  # noqa: F401
            from raymodel.jobs._address import running_handle

            self.server = running_handle()  # the server that made this runner: it dies with it
            for module in imports:
                try:
                    importlib.import_module(module)
                except ImportError:  # the job that needs it imports it, and says what is missing
                    pass

    def run(
        self,
        job_id: str,
        kind: str,
        payload: bytes,
        pool: Any = None,
        hub: Any = None,
        model_class: str = "?",
        datasets: dict[str, Any] | None = None,
        refs: list[Any] | None = None,
        resume: bool = False,
    ) -> dict[str, Any]:
        """``resume``: the job ran before (a server restart): a tune job resumes its experiment."""
        with self.warming:  # the imports ahead, if still under way
            from raymodel.jobs._server.execute import run_job

            self.job_id = job_id
        self.stop_event.clear()
        try:
            return run_job(self, kind, payload, pool, hub, model_class, datasets, refs, resume)
        except BaseException as exc:  # noqa: BLE001 - reported as the job's error
            return {"error": str(exc) or type(exc).__name__, "traceback": traceback.format_exc()}

    def stop(self) -> None:
        self.stop_event.set()

    def stopping(self) -> bool:
        return self.stop_event.is_set()


JobRunnerActor = ray.remote(num_cpus=0)(JobRunner)


class Runners:
    """The runner of each running job, and a spare: the next job's process, its imports done (and the
    frameworks of the server's warm pools, ``warm``). A job of a runtime env of its own gets a runner of
    that env, ended with the job."""

    def __init__(self) -> None:
        self.of_job: dict[str, Any] = {}
        self.imports: tuple[str, ...] = ()  # what the next job's runner imports ahead
        self.calls: tuple[str, ...] = ()  # what it starts ahead (``WarmUp.runner_call``: `--warm rllib`)
        self.spare: Any = new_runner()

    def warm(self, specs: list[tuple[str, int]]) -> None:
        """The server keeps ``specs`` warm (``jobs/_warm.py``): the spare imports their frameworks, and
        starts what a job of a backend without pools starts, while it waits."""
        from raymodel.jobs._warm import runner_imports, runner_warms, warm_pools

        names = [name for spec, _ in warm_pools(specs).values() for name in spec["names"]]
        self.imports, self.calls = runner_imports(names), runner_warms(specs)
        if self.spare is not None:
            self.spare.warm.remote(self.imports, self.calls)

    def start(self, job_id: str, runtime_env: dict[str, Any], *args: Any) -> Any:
        """Run the job (``JobRunner.run``'s ``args``) in the spare, or in a new runner; returns the call."""
        if runtime_env:
            runner = new_runner(self.imports, runtime_env=runtime_env)
        else:
            runner, self.spare = self.spare or new_runner(self.imports, self.calls), None
        self.of_job[job_id] = runner
        return runner.run.remote(job_id, *args)

    def stop(self, job_id: str) -> None:
        """Ask the job's run to stop at its next epoch's end."""
        self.of_job[job_id].stop.remote()

    def kill(self, job_id: str) -> None:
        """End the job's run at once (if it has a runner)."""
        if job_id in self.of_job:
            ray.kill(self.of_job[job_id])

    def finished(self, job_id: str, own_env: bool) -> None:
        """The job's run ended: its runner is the spare (its imports done) if there is none, else it ends."""
        runner = self.of_job.pop(job_id, None)
        if runner is None:
            return
        if own_env or self.spare is not None:
            ray.kill(runner)
            return
        self.spare = runner
        if self.calls:  # it starts ahead again what it ended with its job
            runner.warm.remote((), self.calls)
