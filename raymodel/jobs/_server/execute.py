"""Inside a job's runner actor: the blocking verb, with the job's rows, stop and resources wired in."""

from __future__ import annotations

import dataclasses
from typing import Any

import ray
from ray import tune

from raymodel._internal import serialization
from raymodel.contract import checkpoint as ckpt
from raymodel.hooks import Callback
from raymodel.jobs._address import running_handle
from raymodel.jobs._server.run_events import JobFailures, JobRows
from raymodel.tune import is_reported


def run_job(
    runner: Any,
    kind: str,
    payload: bytes,
    pool: Any = None,
    hub: Any = None,
    model_class: str = "?",
    datasets: dict[str, Any] | None = None,
    refs: list[Any] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """The job's outcome: ``{"result": ...}`` or ``{"error": ..., "traceback": ...}``, and for a job on a
    pool whether the pool can take the next job (``pool_ok``)."""
    try:
        job = serialization.loads(payload)
    except Exception as exc:
        raise RuntimeError(
            f"The model class `{model_class}` cannot be loaded on the cluster: {type(exc).__name__}: {exc}. "
            "Install what it needs on every node (or define it in an importable module)."
        ) from exc
    from raymodel.jobs._request import restore_refs

    tunes = kind == "tune" or "space" in job  # (a tuned release too): Tune puts its data in the store itself
    restore_refs(job["data"], datasets, refs, into_store=not tunes)  # Ray arguments, files
    server = runner.server or running_handle()
    model = job["class"](config=job["config"])
    _restore_state(model, job.get("state"))
    if kind == "release":
        from raymodel.jobs._server.release import run_release

        return run_release(runner, job, model, server, resume, train_stage, tune_stage)
    if kind == "train":
        from raymodel.train import Trainable

        settings = job["settings"]
        settings = dataclasses.replace(
            settings,
            # A blocking call shows a pool's rows and batches through its hub; a one-off run's rows go
            # there from its controller (below), with no printer here.
            progress=settings.progress and hub is not None and pool is not None,
            callbacks=[*settings.callbacks, JobWorkerCallback(server, runner.job_id, stop_vote=False)],
        )
        trainable = Trainable(
            model,
            settings,
            data=job["data"],
            events=[JobRows(server, runner.job_id), JobFailures(server, runner.job_id)],
            info=job.get("info"),
            resume_from=job.get("resume_from"),
            control=(server, runner.job_id),  # stop, preemption and `job.update`, at each epoch's end
        )
        if pool is not None:
            outcome = trainable.run_on_pool(pool, runner.job_id, server, hub=hub, deliver=job.get("deliver", False))
            if "result" in outcome:
                outcome["result"] = dataclasses.asdict(outcome["result"])
            return outcome
        if hub is not None:  # the caller's rows: a blocking call's progress, a Tune trial's (acknowledged)
            from raymodel.train import HubRows

            trainable.add_events(HubRows(hub, wait=job.get("deliver", False)))
        return {"result": dataclasses.asdict(trainable.fit(load_result=False))}
    return {"result": tune_stage(runner, job, model, server, resume)}


def tune_stage(runner: Any, job: dict[str, Any], model: Any, server: Any, resume: bool) -> dict[str, Any]:
    """A tune job (or a tuned release's first stage): the experiment, its trials' rows and stop the
    job's; a server started again resumes the experiment (Tune's own state). The ``TuneResult``'s fields."""
    from raymodel.tune import Tunable

    _RUNNERS[runner.job_id] = runner
    train = job["settings"].train  # each trial's workers tell the server where they run
    train = dataclasses.replace(train, callbacks=[*train.callbacks, JobWorkerCallback(server, runner.job_id)])
    settings = dataclasses.replace(
        job["settings"],
        progress=False,
        train=train,
        callbacks=[*job["settings"].callbacks, JobTrials(server, runner.job_id)],
    )
    again = job["resume"] or (resume and _restorable(settings))  # a server restart: Tune's own state
    tunable = Tunable(model, job["space"], settings=settings, data=job["data"], resume=again)
    tunable.stop = JobStopper(runner.job_id)
    return dataclasses.asdict(tunable.fit())


def train_stage(runner: Any, job: dict[str, Any], model: Any, server: Any) -> dict[str, Any]:
    """A release's training: a one-off run of the job's settings, its rows the job's (a server started
    again resumes it from its run's newest checkpoint); the ``TrainResult``'s fields."""
    from raymodel.train import Trainable

    settings = job["settings"]
    settings = dataclasses.replace(
        settings, progress=False, callbacks=[*settings.callbacks, JobWorkerCallback(server, runner.job_id, False)]
    )
    trainable = Trainable(
        model,
        settings,
        data=job["data"],
        events=[JobRows(server, runner.job_id), JobFailures(server, runner.job_id)],
        control=(server, runner.job_id),
    )
    return dataclasses.asdict(trainable.fit(load_result=False))


def _restorable(settings: Any) -> bool:
    from raymodel._internal import locations, storage

    return tune.Tuner.can_restore(storage.join(settings.storage_path or locations.runs_root(), settings.name))


def _restore_state(model: Any, files: dict[str, bytes] | None) -> None:
    """The submitting instance's weights (``Trainable``'s initial state), when it had any."""
    if not files:
        return
    model.ensure_setup()
    model.backend.set_state(model, ckpt.state_from_files(model, files))


class JobWorkerCallback(Callback):
    """On every training worker (a job's, or a tune job's trial's): tells the server the placement
    group it runs in (``Job.resources`` asks Ray's state API what those hold); with ``stop_vote``
    (a tune job's trial) ends the run at the end of an epoch once the job is stopped (a checkpoint
    is written). A training job's workers ask the server themselves (``WorkerRun``'s control)."""

    def __init__(self, server: Any, job_id: str, stop_vote: bool = True) -> None:
        self.server, self.job_id, self.stop_vote = server, job_id, stop_vote

    def before_fit(self) -> None:
        group = ray.get_runtime_context().get_placement_group_id()
        if group:
            self.server.hold.remote(self.job_id, group)

    def after_epoch(self, epoch: int, metrics: dict[str, Any]) -> None:
        if self.stop_vote and self.context.rank == 0 and ray.get(self.server.stopping.remote(self.job_id)):
            self.context.should_stop = True


#: The runner of each job running in this process. Tune pickles its callbacks and stopper: they
#: hold the job's id and the server's handle, and find the runner here.
_RUNNERS: dict[str, Any] = {}


class JobTrials(tune.Callback):
    """Each trial's config, rows (with ``trial_id``) and end to the server."""

    def __init__(self, server: Any, job_id: str) -> None:
        self.server, self.job_id = server, job_id

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        config = {k: v for k, v in trial.config.items() if isinstance(v, (int, float, str, bool)) or v is None}
        self.server.trial.remote(self.job_id, trial.trial_id, {"config": config, "status": "RUNNING"})

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.server.trial.remote(self.job_id, trial.trial_id, {"status": "TERMINATED"})

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.server.trial.remote(self.job_id, trial.trial_id, {"status": "ERROR"})

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        row = {k: v for k, v in result.items() if is_reported(k) and isinstance(v, (int, float))}
        self.server.push.remote(self.job_id, [dict(row, trial_id=trial.trial_id)])


class JobStopper(tune.Stopper):
    """Stops every trial once the job is stopped; Tune keeps what they reported."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def __call__(self, trial_id: str, result: dict) -> bool:
        return self.stop_all()

    def stop_all(self) -> bool:
        return _RUNNERS[self.job_id].stop_event.is_set()
