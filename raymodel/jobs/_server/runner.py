"""``JobRunner``: the actor that runs one job at a time for the training server (a warm spare waits)."""

from __future__ import annotations

import importlib
import threading
import traceback
from typing import Any, Sequence

import ray

from raymodel._internal import cluster, remote
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
        lazy module: "cannot import name 'PreTrainedTokenizerFast'", seen). ``calls`` (``"module:function"``,
        ``Backend.runner_warm``) start what a job of a backend without pools starts (RLlib's Algorithm
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
