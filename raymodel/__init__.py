"""raymodel: write one model class; train, tune, serve and version it on Ray.

Example:
    >>> import raymodel as rm
    >>> class DigitsNet(rm.RayTorchModel): ...
    >>> result = DigitsNet().train(rm.TrainSettings(num_workers=2), data=rm.data.from_numpy(X, y))
"""

from __future__ import annotations

from typing import Any

from raymodel import data, exceptions
from raymodel._internal.runtime import init
from raymodel.exceptions import (
    CheckpointError,
    ChecksumError,
    DataError,
    HookError,
    MissingDependencyError,
    ModelDefinitionError,
    RayModelError,
    SettingsError,
    TrainingError,
    TuneError,
    ServeError,
    RegistryError,
)
from raymodel.hooks import Callback
from raymodel.model import RayModel
from raymodel.train import TrainResult, TrainSettings

__version__ = "0.1.0"

# The backends import their frameworks lazily: `rm.RayTorchModel` imports torch
# on first access, and a missing framework names the extra to install.
_BACKENDS = {
    "RayTorchModel": "raymodel.backends.torch",
    "RayXGBoostModel": "raymodel.backends.xgboost",
    "RayLightGBMModel": "raymodel.backends.lightgbm",
    "RayLightningModel": "raymodel.backends.lightning",
    "RayTensorflowModel": "raymodel.backends.tensorflow",
}


# Submodules and classes that import Ray Tune / Serve only when first used.
_LAZY = {
    "tune": ("raymodel.tune", None),
    "serve": ("raymodel.serve", None),
    "registry": ("raymodel.registry", None),
    "TuneSettings": ("raymodel.tune", "TuneSettings"),
    "TuneResult": ("raymodel.tune", "TuneResult"),
    "ServeSettings": ("raymodel.serve", "ServeSettings"),
    "ServedModel": ("raymodel.serve", "ServedModel"),
    "ModelRef": ("raymodel.registry", "ModelRef"),
}


def __getattr__(name: str) -> Any:
    if name in _BACKENDS:
        import importlib

        # The backend module first: it may set up the framework's environment before its import.
        value = getattr(importlib.import_module(_BACKENDS[name]), name)
        value.backend.import_framework()  # a missing framework names the extra to install
        globals()[name] = value
        return value
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raymodel' has no attribute {name!r}")


__all__ = [
    "RayModel",
    "RayTorchModel",
    "RayLightningModel",
    "RayTensorflowModel",
    "RayXGBoostModel",
    "RayLightGBMModel",
    "Callback",
    "TrainSettings",
    "TrainResult",
    "TuneSettings",
    "TuneResult",
    "ServeSettings",
    "ServedModel",
    "ModelRef",
    "tune",
    "serve",
    "registry",
    "data",
    "exceptions",
    "init",
    "RayModelError",
    "SettingsError",
    "ModelDefinitionError",
    "DataError",
    "MissingDependencyError",
    "HookError",
    "CheckpointError",
    "ChecksumError",
    "TrainingError",
    "TuneError",
    "ServeError",
    "RegistryError",
]
