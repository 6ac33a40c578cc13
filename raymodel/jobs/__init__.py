"""Jobs: ``model.train(..., wait=False)`` and ``model.tune(..., wait=False)`` on the training server.

The server is a detached, named Ray actor (``raymodel-job-server``), used if
running and started if not; any process attached to the same cluster sees
every job::

    job = model.train(settings, data=data, wait=False)
    for row in job.stream(): ...
    job.stop(); result = job.wait()
    rm.jobs.list(); rm.jobs.get(job_id)
"""

from __future__ import annotations

from raymodel import contract
from raymodel.jobs._client import init, server_handle as server
from raymodel.jobs._constants import ACTIVE, DONE, UPDATABLE
from raymodel.jobs._from_registry import check_register, load_data, split_sets
from raymodel.jobs._job import Job, JobNotFound
from raymodel.jobs._listing import (
    Pool,
    get,
    list_jobs as list,
    pools,
    records,
    release_pools,
    wait_warm,
)
from raymodel.jobs._port import ServerClient
from raymodel.jobs._release import follow as follow_release, submit_release
from raymodel.jobs._release_plan import Gate, ReleaseResult, RolloutPlan, current_stage, describe as describe_stage
from raymodel.jobs._submit import submit, submit_train, submit_tune, train_and_wait, tune_and_wait
from raymodel.jobs._views import Stream, held
from raymodel.jobs._warm import cpus_needed as warm_cpus, parse_warm, shown as shown_warm

__all__ = [
    "Job",
    "Gate",
    "RolloutPlan",
    "ReleaseResult",
    "follow_release",
    "submit_release",
    "current_stage",
    "describe_stage",
    "list",
    "records",
    "get",
    "held",
    "Stream",
    "JobNotFound",
    "server",
    "pools",
    "release_pools",
    "wait_warm",
    "Pool",
    "submit",
    "submit_train",
    "submit_tune",
    "train_and_wait",
    "tune_and_wait",
    "init",
    "ACTIVE",
    "DONE",
    "UPDATABLE",
    "check_register",
    "load_data",
    "split_sets",
    "parse_warm",
    "shown_warm",
    "warm_cpus",
]

#: The drivers below ``raymodel.jobs`` (train, tune, serve, predict) reach the server through this port.
contract.provide_training_server(ServerClient())
