"""The run type (``raymodel.contract.TrainingRun``): what every run gives its driver, and where Ray Train's
own types stay. Unit tests: the logic runs in this process, on no Ray."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from models import TinyNet
from rl_models import Balancer

import raymodel as rm
from raymodel.contract import RunEvents, RunOutcome, RunPlan, TrainingRun, failure_text

PACKAGE = Path(rm.__file__).parent
RAY_TRAIN_RUN = PACKAGE / "train" / "_ray_train_run.py"

#: Ray Train's driver-side types: its run's configuration, its callbacks and its result.
RAY_TRAIN_TYPES = {
    "UserCallback",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "FailureConfig",
    "CheckpointConfig",
    "TrainingFailedError",
}
#: What a stand-in for them would name: a callback's methods, a result's fields.
RAY_TRAIN_NAMES = {"after_report", "after_exception", "before_init_train_context", "best_checkpoints", "return_value"}


def _ray_train_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ray.train"):
            found += [f"imports {a.name}" for a in node.names if a.name in RAY_TRAIN_TYPES]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in RAY_TRAIN_NAMES:
            found.append(f"defines {node.name}")
        elif isinstance(node, ast.Attribute) and node.attr in RAY_TRAIN_NAMES:
            found.append(f"reads .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in RAY_TRAIN_NAMES:
            found.append(f"passes {node.arg}=")
    return found


def test_ray_trains_callback_and_result_types_stay_inside_the_ray_train_run():
    """No module but the Ray Train run's imports Ray Train's run types, defines a callback's methods or
    reads a result's fields: nothing else imitates Ray Train (RLlib's run and the jobs package included)."""
    assert _ray_train_uses(RAY_TRAIN_RUN), "the check looks for what the Ray Train run does use"
    outside = {
        str(p.relative_to(PACKAGE)): uses
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != RAY_TRAIN_RUN and (uses := _ray_train_uses(p))
    }
    assert outside == {}


def test_each_backends_run_is_a_training_run_of_its_plan(no_ray):
    """A Ray Train backend's run is the Ray Train run; RLlib's is its Algorithm's actor. Both are
    ``TrainingRun``s of the plan they were given, and the plan says what the settings say."""
    from raymodel.backends.rllib._run import AlgorithmRun
    from raymodel.train._ray_train_run import RayTrainRun

    settings = {"num_epochs": 1, "num_workers": 2, "max_failures": 3, "keep_checkpoints": 2, "progress": False}
    trainable = rm.Trainable(Balancer(), settings, data=None)
    plan, hub = trainable._plan(printer=None)
    assert (plan.path, plan.num_workers, plan.max_failures, plan.keep_checkpoints) == (trainable.path, 2, 3, 2)
    assert plan.events == () and hub is None and plan.elastic_resize_s is None
    told = _Told()
    trainable.add_events(told)
    assert trainable._plan(printer=None)[0].events == (told,)
    for model, run_type in ((TinyNet(), RayTrainRun), (Balancer(), AlgorithmRun)):
        run = rm.Trainable(model, {"num_epochs": 1}, data=_data(model))._run(plan)
        assert type(run) is run_type and run.plan is plan and isinstance(run, TrainingRun)
    with pytest.raises(TypeError, match="rllib backend's runs are not Ray Train runs"):
        RayTrainRun(Balancer.backend, plan)


def _data(model: Any) -> Any:
    if isinstance(model, Balancer):
        return None
    import numpy as np

    return {"train": (np.zeros((8, 4), "float32"), np.zeros(8, "int64"))}


class _Told(RunEvents):
    def __init__(self) -> None:
        self.rows: list[tuple[dict[str, Any], str | None]] = []
        self.failed: list[dict[int, str]] = []

    def row(self, row: dict[str, Any], checkpoint: str | None) -> None:
        self.rows.append((row, checkpoint))

    def workers_failed(self, failures: dict[int, str]) -> None:
        self.failed.append(failures)


def test_the_ray_train_run_tells_its_events_rows_with_located_checkpoints_and_failures():
    """Train V2's controller calls the run's one callback; the plan's events get rank 0's row, the
    checkpoint with the storage's scheme back, and each failed worker named."""
    from raymodel.train._ray_train_run import _Events

    told, quiet = _Told(), RunEvents()
    callback = _Events((told, quiet), "s3://bucket/runs?endpoint_override=localhost:9000")

    class Checkpoint:
        path = "bucket/runs/r1/checkpoint_epoch_000002"

    callback.after_report(None, [{"epoch": 2, "loss": 0.5}, {"epoch": 2, "loss": 0.7}], Checkpoint())
    callback.after_report(None, [{"epoch": 3, "loss": 0.4}], None)
    callback.after_report(None, [], None)  # a report with no metrics tells nothing
    assert told.rows == [
        ({"epoch": 2, "loss": 0.5}, "s3://bucket/runs/r1/checkpoint_epoch_000002?endpoint_override=localhost:9000"),
        ({"epoch": 3, "loss": 0.4}, None),
    ]
    callback.after_exception(None, {1: RuntimeError("line one\nworker 1 died")})
    assert told.failed == [{1: "RuntimeError: worker 1 died"}]
    assert failure_text(ValueError("")) == "ValueError: "


#: The rows of a four-epoch run, and the epochs whose checkpoints it kept (``_kept``).
HISTORY = [{"epoch": e, "val_loss": v} for e, v in ((1, 0.9), (2, 0.3), (3, 0.5), (4, 0.4))]


def _kept(folder: Path) -> RunOutcome:
    """The outcome of a run that kept the checkpoints of epochs 2 to 4 in ``folder`` (and began a fifth)."""
    for epoch in (2, 3, 4):
        (folder / f"checkpoint_epoch_{epoch:06d}").mkdir()
    (folder / "checkpoint_epoch_000005.tmp").mkdir()  # not a complete checkpoint
    return RunOutcome.from_storage(str(folder), {"history": HISTORY})


def test_an_outcome_from_storage_pairs_each_kept_checkpoint_with_its_epochs_row(tmp_path):
    """A run that keeps its checkpoints itself (a pool's job, RLlib's actor) gives the ones in its folder
    with the rows of their epochs."""
    assert [(Path(c).name, row["val_loss"]) for c, row in _kept(tmp_path).checkpoints] == [
        ("checkpoint_epoch_000002", 0.3),
        ("checkpoint_epoch_000003", 0.5),
        ("checkpoint_epoch_000004", 0.4),
    ]


def test_the_result_of_an_outcome_takes_the_newest_checkpoint_and_the_best_by_the_metric(tmp_path):
    from raymodel.train._driver import _collect

    outcome, history = _kept(tmp_path), HISTORY
    settings = rm.TrainSettings(metric="val_loss", mode="min")
    result = _collect(TinyNet(), settings, outcome, "r1", load_result=False)
    assert Path(result.checkpoint).name == "checkpoint_epoch_000004"
    assert Path(result.best_checkpoint).name == "checkpoint_epoch_000002"
    assert result.metrics == history[-1] and result.path == str(tmp_path)
    maximized = _collect(TinyNet(), rm.TrainSettings(metric="val_loss", mode="max"), outcome, "r1", False)
    assert Path(maximized.best_checkpoint).name == "checkpoint_epoch_000003"
    with pytest.warns(UserWarning, match=r"`metric='acc'` was never reported"):
        unscored = _collect(TinyNet(), rm.TrainSettings(metric="acc"), outcome, "r1", False)
    assert unscored.best_checkpoint is None


def test_a_plan_places_its_folder_under_its_storage():
    plan = RunPlan(name="r1", storage="s3://bucket/runs?endpoint_override=x", loop=print, loop_config={})
    assert plan.path == "s3://bucket/runs/r1?endpoint_override=x"


def test_a_ray_train_run_starts_no_helper_it_does_not_need(no_ray, tmp_path):
    """Ray Train V2 starts a ``DatasetManager`` and a ``PlacementGroupCleaner`` actor for every run: a run
    with no Ray Dataset goes without the first; a pool's run (the server sweeps its placement groups)
    without the second; a run with both needs keeps both."""
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from raymodel.train._ray_train_run import RayTrainRun

    def callbacks(datasets: dict[str, Any], swept: bool) -> list[str]:
        plan = RunPlan(
            name="r", storage=str(tmp_path), loop=print, loop_config={}, datasets=datasets, groups_swept=swept
        )
        made = RayTrainRun(TinyNet.backend, plan).trainer()._create_default_callbacks()
        return [type(c).__name__ for c in made]

    data, cleaner = DatasetsCallback.__name__, PlacementGroupCleanerCallback.__name__
    everything = callbacks({"train": object()}, swept=False)
    assert data in everything and cleaner in everything  # Ray's own list: what the run filters from
    assert callbacks({}, swept=False) == [c for c in everything if c != data]
    assert callbacks({"train": object()}, swept=True) == [c for c in everything if c != cleaner]
    assert callbacks({}, swept=True) == [c for c in everything if c not in (data, cleaner)]


def test_a_torch_runs_process_group_is_rays_torch_config(no_ray, tmp_path):
    """``ProcessGroup`` (``backends/torch/process_group.py``) is Ray's ``TorchConfig``: its fields and their
    defaults, its state export and framework, and Ray's own steps on the workers (checked here when Ray
    is upgraded); a torch run's ``TorchTrainer`` carries it."""
    import dataclasses

    from ray.train.torch import TorchTrainer, config as ray_torch

    from raymodel.backends.torch.process_group import ProcessGroup
    from raymodel.train._ray_train_run import RayTrainRun

    ours, rays = ProcessGroup(), ray_torch.TorchConfig()
    fields = lambda config: [(f.name, f.default) for f in dataclasses.fields(config)]  # noqa: E731
    assert fields(ours) == fields(rays) and ours.to_dict() == rays.to_dict() and ours.framework == rays.framework
    assert ours.backend_cls.share_cuda_visible_devices == rays.backend_cls.share_cuda_visible_devices
    for step in ("_set_torch_distributed_env_vars", "_setup_torch_process_group", "_shutdown_torch"):
        assert callable(getattr(ray_torch, step)), step
    assert callable(ray_torch.TorchConfigContextManager)
    plan = RunPlan(name="r", storage=str(tmp_path), loop=print, loop_config={})
    trainer = RayTrainRun(TinyNet.backend, plan).trainer()
    assert isinstance(trainer, TorchTrainer) and isinstance(trainer.backend_config, ProcessGroup)


def test_what_a_torch_runs_controller_unpickles_of_its_process_group_imports_no_torch(no_ray, tmp_path):
    """The process group of a torch run's trainer, as its controller unpickles it, imports no torch (Ray's
    ``TorchConfig`` does: its module imports torch). In a fresh process, as the controller is."""
    import subprocess
    import sys

    import cloudpickle
    from ray.train.torch import config as ray_torch

    from raymodel.train._ray_train_run import RayTrainRun

    plan = RunPlan(name="r", storage=str(tmp_path), loop=print, loop_config={})
    config = RayTrainRun(TinyNet.backend, plan).trainer().backend_config
    blob = cloudpickle.dumps((config, config.backend_cls, config.train_func_context))
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())[0].framework; print('torch' in sys.modules)"
    unpickled = lambda blob: subprocess.run(  # noqa: E731 - a fresh process, as the controller is
        [sys.executable, "-c", code], input=blob, capture_output=True, check=True
    ).stdout.strip()
    assert unpickled(blob) == b"False"
    rays = ray_torch.TorchConfig()
    rays_blob = cloudpickle.dumps((rays, rays.backend_cls, rays.train_func_context))
    assert unpickled(rays_blob) == b"True"  # what the check would see of Ray's own


def test_a_torch_runs_own_trainer_is_a_data_parallel_trainer_with_the_process_group(no_ray, tmp_path):
    """raymodel's own run of a torch, Lightning or transformers model (``RayTrainRun.fit``: a pool's, a
    one-off's) is Ray's ``DataParallelTrainer`` with ``ProcessGroup``, which is what ``TorchTrainer`` builds.
    ``as_trainer()`` and a run of no workers (Ray Train's local mode) keep ``TorchTrainer``."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from raymodel.backends.torch.backend import TorchBackend
    from raymodel.backends.torch.process_group import ProcessGroup
    from raymodel.train._ray_train_run import RayTrainRun

    run = lambda workers: RayTrainRun(  # noqa: E731
        TorchBackend(), RunPlan(name="r", storage=str(tmp_path), loop=print, loop_config={}, num_workers=workers)
    )
    own = run(2).trainer(own=True)
    assert type(own) is DataParallelTrainer and isinstance(own.backend_config, ProcessGroup)
    assert isinstance(run(2).trainer(), TorchTrainer)  # as_trainer()'s
    assert isinstance(run(0).trainer(own=True), TorchTrainer)  # local mode: TorchTrainer's own controller


def test_a_keras_runs_workers_get_keras_2_whatever_the_runs_own_environment(no_ray, tmp_path):
    """Ray's TensorFlow backend imports TensorFlow on each worker before raymodel's loop runs, so a Keras
    run's trainer gives every worker ``TF_USE_LEGACY_KERAS=1`` beside the run's own variables; another
    backend's trainer leaves the run's runtime env as it was."""
    import dataclasses

    from ray.train import RunConfig, ScalingConfig

    from raymodel.backends.tensorflow import TensorflowBackend
    from raymodel.contract import DATA_PARALLEL, RayTrain

    def worker_env(training: RayTrain, runtime_env: dict | None) -> dict | None:
        trainer = dataclasses.replace(training, trainer=DATA_PARALLEL).make_trainer(  # no TensorFlow imported
            print,
            train_loop_config={},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="r", storage_path=str(tmp_path), worker_runtime_env=runtime_env),
            datasets=None,
        )
        return trainer.run_config.worker_runtime_env

    keras = TensorflowBackend.training
    mine = {"env_vars": {"MINE": "1", "TF_USE_LEGACY_KERAS": "0", "TF_CPP_MIN_LOG_LEVEL": "0"}, "pip": ["x"]}
    assert worker_env(keras, mine) == {
        "env_vars": {"MINE": "1", "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "0"},
        "pip": ["x"],
    }
    assert worker_env(keras, None)["env_vars"]["TF_USE_LEGACY_KERAS"] == "1"
    assert worker_env(RayTrain("m:Loop"), None) in (None, {})
    assert worker_env(RayTrain("m:Loop"), mine) == mine


def test_building_a_torch_runs_own_trainer_imports_no_torch(no_ray, tmp_path):
    """The process that fits raymodel's own torch run (a pool's actor, a job's runner) does not import torch
    (``TorchTrainer``'s module does) before it asks for the run's controller. Built in a fresh process, as a
    pool's actor builds it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from raymodel.backends.torch.backend import TorchBackend\n"
        "from raymodel.contract import RunPlan\n"
        "from raymodel.train._ray_train_run import RayTrainRun\n"
        "plan = RunPlan(name='r', storage=sys.argv[1], loop=print, loop_config={}, num_workers=(1, 2))\n"
        "trainer = RayTrainRun(TorchBackend(), plan).trainer(own=True)\n"
        "print(type(trainer).__name__, type(trainer.backend_config).__name__, 'torch' in sys.modules)\n"
    )
    built = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert built.stdout.split() == ["DataParallelTrainer", "ProcessGroup", "False"], built.stderr[-2000:]
