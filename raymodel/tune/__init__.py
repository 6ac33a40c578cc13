"""Tuning with Ray Tune: ``model.tune(space, settings=..., data=...)``.

Each trial is an ordinary ``model.train()`` run (Train is the base; Tune calls
Train). The sampling functions of Ray Tune are re-exported here, so a space
reads ``{"lr": rm.tune.loguniform(1e-4, 1e-2)}``.
"""

from ray.tune import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)

from raymodel.tune._driver import Tunable, load_best
from raymodel.tune._reported import is_reported
from raymodel.tune._result import TuneResult
from raymodel.tune._settings import TuneSettings

__all__ = [
    "is_reported",
    "Tunable",
    "load_best",
    "TuneSettings",
    "TuneResult",
    "choice",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "sample_from",
    "uniform",
]
