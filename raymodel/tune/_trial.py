"""One trial: an ordinary training run inside a Ray Tune function trainable.

Tune calls Train: a trial runs the same ``WorkerRun`` lifecycle as
``model.train()``, placed one of two ways:

* **one worker** (``num_workers`` 0 or 1, the default for tuning): in the
  trial's own process, which holds the worker's resources. No Ray Train
  worker group is started, so a trial costs its epochs, not a worker group's
  start-up (``TrialSession``);
* **a run that is not a Ray Train worker group** (RLlib: the Algorithm and its
  env runners): in the trial's own process too, the env runners in the
  trial's placement group, one bundle each (``OwnRuns.trial_bundles``);
* **several workers**: a Ray Train V2 worker group, as ``model.train()`` uses;
  its epochs reach the trial through the run's hub and are acknowledged once
  Tune has them, so training waits for Tune's decision before the next epoch.

Either way each epoch goes to Tune with ``tune.report`` and a small *pointer*
checkpoint naming the training checkpoint of that epoch. Tune keeps the
pointers, so a trial that Tune restarts (a restored experiment, or PBT
exploiting another trial) gets one from ``tune.get_checkpoint()`` and
continues from the checkpoint it names: its own, or the donor's, with the
trial's (possibly mutated) config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
from typing import Any

from raymodel._internal import serialization, storage as locations
from raymodel.contract import OwnRuns, training_server
from raymodel.train import LocalSession, start_hub, stop_hub, worker_resources

#: A config key ``"train.<field>"`` sets that ``TrainSettings`` field for the trial.
TRAIN_PREFIX = "train."
POINTER = "raymodel-pointer.json"


def trial(config: dict[str, Any], payload: bytes, data: Any) -> None:
    """Train the model with this trial's config (``model.train()``'s code path); report every epoch to Tune."""
    from ray import tune

    from raymodel.train import Trainable

    unpacked = serialization.loads(payload)
    model = unpacked["class"](config={k: v for k, v in config.items() if not k.startswith(TRAIN_PREFIX)})
    settings = trial_settings(unpacked["train"], config)
    context = tune.get_context()
    given = tune.get_checkpoint()
    resume_from = _pointed(given) if given is not None else None
    # A restarted trial starts a new training run beside the old one, from the checkpoint Tune handed back.
    name = "train" if resume_from is None else f"train-{os.urandom(3).hex()}"
    settings = dataclasses.replace(
        settings, name=name, storage_path=trial_dir(context, unpacked.get("storage")), progress=False
    )
    info = {"experiment": context.get_experiment_name(), "trial_id": context.get_trial_id()}
    if runs_in_trial(settings, data, model.backend):
        trainable = Trainable(model, settings, data=data, resume_from=resume_from, info=info)
        trainable.run_here(TrialSession(trainable.path, keep=settings.keep_checkpoints))
    else:
        _run_worker_group(model, settings, data, resume_from, info)


def trial_settings(train: Any, config: dict[str, Any]) -> Any:
    """The trial's ``TrainSettings``: the experiment's, with the trial's ``train.<field>`` values."""
    overrides = {k[len(TRAIN_PREFIX) :]: v for k, v in config.items() if k.startswith(TRAIN_PREFIX)}
    return dataclasses.replace(train, **overrides)


def runs_in_trial(settings: Any, data: Any, backend: Any) -> bool:
    """A run that is not a Ray Train worker group (RLlib's Algorithm and its env runners), or one
    worker and no ``ray.data`` split (those are read through a worker group's shards)."""
    if isinstance(backend.training, OwnRuns):
        return True
    return settings.num_workers <= 1 and not getattr(data, "ray_datasets", None)


#: The ``TrainSettings`` fields that decide what a trial holds.
PLACEMENT_FIELDS = ("num_workers", "resources_per_worker", "use_gpu")


def trial_bundles(
    backend: Any, num_workers: int, resources_per_worker: dict[str, float] | None, use_gpu: bool
) -> list[dict[str, float]]:
    """The placement group of a trial: the backend's own bundles for a run in the trial's process
    that starts actors of its own (RLlib: the Algorithm, then one bundle per env runner); else one
    bundle, its one worker's resources, or a sliver when a worker group does the work."""
    if isinstance(backend.training, OwnRuns):
        return [dict(b) for b in backend.training.trial_bundles(num_workers, use_gpu)]
    if num_workers > 1:
        return [{"CPU": 0.01}]  # the trial only drives the run; the worker group holds the resources
    return [worker_resources(resources_per_worker, use_gpu)]


def trial_resources(
    backend: Any, num_workers: int, resources_per_worker: dict[str, float] | None, use_gpu: bool
) -> dict[str, float]:
    """What a trial holds in all (``trial_bundles`` added up)."""
    total: dict[str, float] = {}
    for bundle in trial_bundles(backend, num_workers, resources_per_worker, use_gpu):
        for k, v in bundle.items():
            if v:
                total[k] = total.get(k, 0.0) + float(v)
    return total


def resources_of(base: dict[str, Any], pickled_backend: bytes, config: dict[str, Any]) -> Any:
    """The placement group (a ``PlacementGroupFactory``) of a trial's config (``base``: the
    experiment's placement fields; ``train.*`` placement may be tuned; ``pickled_backend``: the
    model's backend by ``serialization.dumps``, by value, as Tune pickles this with the trainable)."""
    from ray.tune import PlacementGroupFactory

    backend = serialization.loads(pickled_backend)
    fields = dict(base)
    for name in PLACEMENT_FIELDS:
        fields[name] = config.get(f"{TRAIN_PREFIX}{name}", fields[name])
    bundles = [{k: v for k, v in b.items() if v} for b in trial_bundles(backend, **fields)]
    return PlacementGroupFactory(bundles, strategy="PACK")


class TrialSession(LocalSession):
    """Places a ``WorkerRun`` in the trial's own process (one worker): checkpoints go to the training
    run's folder in the experiment's storage, each epoch to Tune (with a pointer to its checkpoint)."""

    def deliver(self, row: dict[str, Any]) -> None:
        _report_to_tune(row)


def trial_dir(context: Any, root: str | None) -> str:
    """The trial's folder in the experiment's storage (not Tune's local staging copy); on an
    object store, under ``root`` (the experiment's ``storage_path``, which keeps its scheme and
    query: Tune's own storage context keeps only the path on the filesystem)."""
    storage = context.get_storage()
    if root is None or not locations.is_uri(root):
        return storage.trial_fs_path
    return locations.join(root, storage.experiment_dir_name, storage.trial_dir_name)


def on_pool(settings: Any, backend: Any) -> bool:
    """Whether a trial's training is a job of the training server on a pool: a Ray Train run of
    several workers, with settings that go to a pool (``TrainSettings.on_pool``); else the trial
    trains on its own."""
    return backend.pool is not None and settings.num_workers > 1 and settings.on_pool


def _run_worker_group(model: Any, settings: Any, data: Any, resume_from: str | None, info: dict[str, Any]) -> None:
    server = training_server()
    if settings.on_pool and server.running():  # a worker group's trial (several workers, or ray.data splits)
        _run_on_pool(server, model, settings, data, resume_from, info)
        return
    from raymodel.train import HubRows, Trainable

    hub = start_hub()
    try:
        trainable = Trainable(
            model, settings, data=data, events=[HubRows(hub, wait=True)], hub=hub, resume_from=resume_from, info=info
        )
        outcome: dict[str, Any] = {}
        runner = threading.Thread(target=_fit, args=(trainable, outcome), name="raymodel-trial", daemon=True)
        runner.start()
        while runner.is_alive():
            _relay(hub, timeout=0.5)
        _relay(hub, timeout=0.0)  # the rows that came in with the end of the run
        if "error" in outcome:
            raise outcome["error"]
    finally:
        stop_hub(hub)


def _run_on_pool(
    server: Any, model: Any, settings: Any, data: Any, resume_from: str | None, info: dict[str, Any]
) -> None:
    """The trial's training as a job of the training server, on a pool: its rows come through the
    trial's hub, each acknowledged once Tune has it; a trial that ends early stops its job."""
    from raymodel.train import prepare

    settings, spec = prepare(model, settings, data)
    hub = start_hub()
    try:
        server.train_job(
            model,
            settings,
            spec,
            hub=hub,
            info=info,
            resume_from=resume_from,
            relay=lambda done: _relay(hub, timeout=0.0 if done else 0.5),
        )
    finally:
        stop_hub(hub)


def _fit(trainable: Any, outcome: dict[str, Any]) -> None:
    try:
        trainable.fit(load_result=False)
    except BaseException as exc:  # noqa: BLE001 - raised again in the trial's own thread
        outcome["error"] = exc


def _relay(hub: Any, timeout: float) -> None:
    """Pass the worker group's rows on to Tune, acknowledging each once Tune has it."""
    import ray

    for row in ray.get(hub.pop.remote(timeout)):
        row_id = row.pop("_row_id", None)
        _report_to_tune(row)
        if row_id is not None:
            hub.ack.remote(row_id)  # Tune has the epoch: the run may go on


def _report_to_tune(row: dict[str, Any]) -> None:
    from ray import tune

    path = row.get("checkpoint_path")
    if path is None:
        tune.report(row)
        return
    with tempfile.TemporaryDirectory(prefix="raymodel-pointer-") as pointer:
        with open(os.path.join(pointer, POINTER), "w") as fh:
            json.dump({"checkpoint": path}, fh)
        tune.report(row, checkpoint=tune.Checkpoint.from_directory(pointer))


def _pointed(checkpoint: Any) -> str:
    """The training checkpoint a Tune pointer checkpoint names."""
    with checkpoint.as_directory() as directory:
        with open(os.path.join(directory, POINTER)) as fh:
            return json.load(fh)["checkpoint"]
