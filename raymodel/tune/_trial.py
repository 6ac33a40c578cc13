"""One trial: an ordinary training run inside a Ray Tune function trainable.

The trial's Train run reports each epoch to the run's hub (a Ray Train
``UserCallback``); the trial function passes every row on to Tune with
``tune.report``, with a small *pointer* checkpoint naming the Train
checkpoint of that epoch. Tune keeps the pointers, so a trial that Tune
restarts (a restored experiment, or PBT exploiting another trial) gets one
from ``tune.get_checkpoint()`` and continues from the checkpoint it names:
its own, or the donor's, with the trial's (possibly mutated) config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
from typing import Any

from raymodel._internal import serialization

#: A config key ``"train.<field>"`` sets that ``TrainSettings`` field for the trial.
TRAIN_PREFIX = "train."
POINTER = "raymodel-pointer.json"


def trial(config: dict[str, Any], payload: bytes, data: Any) -> None:
    """Train the model with this trial's config (``model.train()``'s code path); report every epoch to Tune."""
    from ray import tune

    from raymodel._internal.hub import start_hub, stop_hub
    from raymodel.train import Trainable
    from raymodel.train._progress import ProgressCallback

    unpacked = serialization.loads(payload)
    model = unpacked["class"](config={k: v for k, v in config.items() if not k.startswith(TRAIN_PREFIX)})
    overrides = {k[len(TRAIN_PREFIX):]: v for k, v in config.items() if k.startswith(TRAIN_PREFIX)}
    context = tune.get_context()
    given = tune.get_checkpoint()
    resume_from = _pointed(given) if given is not None else None
    # A restarted trial starts a new Train run beside the old one, from the checkpoint Tune handed back.
    name = "train" if resume_from is None else f"train-{os.urandom(3).hex()}"
    settings = dataclasses.replace(unpacked["train"], name=name, storage_path=trial_dir(context), progress=False,
                                   **overrides)
    hub = start_hub()
    try:
        trainable = Trainable(model, settings, data=data, callbacks=[ProgressCallback(hub, wait=True)], hub=hub,
                              resume_from=resume_from,
                              info={"experiment": context.get_experiment_name(), "trial_id": context.get_trial_id()})
        outcome: dict[str, Any] = {}
        runner = threading.Thread(target=_fit, args=(trainable, outcome), name="raymodel-trial", daemon=True)
        runner.start()
        while runner.is_alive():
            _report(hub, timeout=0.5)
        _report(hub, timeout=0.0)  # the rows that came in with the end of the run
        if "error" in outcome:
            raise outcome["error"]
    finally:
        stop_hub(hub)


def trial_dir(context: Any) -> str:
    """The trial's folder in the experiment's storage (not Tune's local staging copy)."""
    storage = context.get_storage()
    if type(storage.storage_filesystem).__name__ == "LocalFileSystem":
        return storage.trial_fs_path
    return "/".join([storage.storage_path.rstrip("/"), storage.experiment_dir_name, storage.trial_dir_name])


def _fit(trainable: Any, outcome: dict[str, Any]) -> None:
    try:
        trainable.fit(load_result=False)
    except BaseException as exc:  # noqa: BLE001 - raised again in the trial's own thread
        outcome["error"] = exc


def _report(hub: Any, timeout: float) -> None:
    import ray
    from ray import tune

    for row in ray.get(hub.pop.remote(timeout)):
        row_id = row.pop("_row_id", None)
        path = row.get("checkpoint_path")
        if path is None:
            tune.report(row)
        else:
            with tempfile.TemporaryDirectory(prefix="raymodel-pointer-") as pointer:
                with open(os.path.join(pointer, POINTER), "w") as fh:
                    json.dump({"checkpoint": path}, fh)
                tune.report(row, checkpoint=tune.Checkpoint.from_directory(pointer))
        if row_id is not None:
            hub.ack.remote(row_id)  # Tune has the epoch: the run may go on


def _pointed(checkpoint: Any) -> str:
    """The Train checkpoint a Tune pointer checkpoint names."""
    with checkpoint.as_directory() as directory:
        with open(os.path.join(directory, POINTER)) as fh:
            return json.load(fh)["checkpoint"]
