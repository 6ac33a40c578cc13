"""One trial: an ordinary training run inside a Ray Tune function trainable."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from raymodel._internal import serialization


def trial(config: dict[str, Any], payload: bytes, data: Any) -> None:
    """Run ``model.train()``'s code path with this trial's config; Train's reports go to Tune.

    The Train run lives in the trial's folder (``<experiment>/<trial>/train``), so a
    resumed experiment finds it, and Ray Train continues it from its latest
    checkpoint.
    """
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from raymodel.train import run_training

    unpacked = serialization.loads(payload)
    model = unpacked["class"](config=config)
    context = tune.get_context()
    # In the experiment's storage folder (not Tune's local staging copy), next to the trial's own files.
    trial_dir = f"{unpacked['path']}/{os.path.basename(context.get_trial_dir().rstrip('/'))}"
    settings = dataclasses.replace(unpacked["train"], name="train", storage_path=trial_dir, progress=False)
    run_training(model, settings, data, extra_callbacks=[TuneReportCallback()], load_result=False,
                 info={"experiment": context.get_experiment_name(), "trial_id": context.get_trial_id()})
