"""The backend contract: what every driver needs to know of a backend, and nothing above it.

* ``Backend`` and ``WorkerLoop``: the seam a framework plug-in fills in
  (``raymodel/backends/`` holds the built-in ones), and the backend's capabilities, each a part:
  ``RayTrain`` or ``OwnRuns`` (its training), ``Inference``, ``TextGeneration``, ``PoolKind``, ``WarmUp``;
* the backend table (``register``, ``model_classes``, ``backends``),
  which plug-ins push themselves into when their model base class is defined;
* the protocols the layers below the plug-ins type against: ``Model``
  (a model, for the drivers) and ``RunOnWorker`` (a training run on one worker, for a worker loop);
* the array helpers the backends' defaults and the serving path share;
* ``TrainingRun`` (with ``RunPlan``, ``RunEvents``, ``RunOutcome``): what a driver and the
  training server need of any run, whatever places it (Ray Train, RLlib's Algorithm);
* ``TrainingServer``: the port through which the drivers ask the training
  server for room and for a trial's job (``raymodel.jobs`` provides it).
* two modules of their own: ``raymodel.contract.checkpoint``, the one checkpoint format of
  every backend, and ``raymodel.contract.schema``, a model's declared input and output schemas.

Example (a plug-in, in its own module):
    >>> from raymodel.contract import Backend, RayTrain, WorkerLoop
    >>> class SklearnBackend(Backend):
    ...     name = "sklearn"
    ...     imports = ("sklearn",)
    ...     training = RayTrain(loop="my_plugin.loop:SklearnLoop")
    >>> class RaySklearnModel(rm.RayModel):
    ...     backend = SklearnBackend()          # registers in the table here
"""

from raymodel.contract._arrays import (
    batch_len,
    columns_of,
    features_of,
    rows_of,
    split_nested,
    to_jsonable,
)
from raymodel.contract._backend import (
    DATA_KINDS,
    UNRECORDED_NAN,
    Backend,
    Model,
    PoolKind,
    RunOnWorker,
    WarmUp,
    WorkerLoop,
)
from raymodel.contract._generation import TextGeneration, TextRequest, text_generation
from raymodel.contract._inference import Inference
from raymodel.contract._server_port import TrainingServer, provide_training_server, training_server
from raymodel.contract._table import backends, defined, defined_backends, hook_table, model_classes, register
from raymodel.contract._training import DATA_PARALLEL, OwnRuns, RayTrain, Training, worker_resources
from raymodel.contract._training_run import RunEvents, RunOutcome, RunPlan, TrainingRun, failure_text

__all__ = [
    "Backend",
    "Training",
    "RayTrain",
    "OwnRuns",
    "DATA_PARALLEL",
    "Inference",
    "PoolKind",
    "WarmUp",
    "WorkerLoop",
    "DATA_KINDS",
    "UNRECORDED_NAN",
    "Model",
    "RunOnWorker",
    "register",
    "model_classes",
    "backends",
    "defined",
    "defined_backends",
    "hook_table",
    "rows_of",
    "features_of",
    "columns_of",
    "batch_len",
    "split_nested",
    "to_jsonable",
    "worker_resources",
    "TextRequest",
    "TextGeneration",
    "text_generation",
    "TrainingServer",
    "training_server",
    "provide_training_server",
    "TrainingRun",
    "RunPlan",
    "RunEvents",
    "RunOutcome",
    "failure_text",
]
