"""raymodel: write one model class; train, tune, serve and version it on Ray.

Example:
    >>> import raymodel as rm
    >>> class DigitsNet(rm.RayTorchModel): ...
    >>> result = DigitsNet().train(rm.TrainSettings(num_workers=2), data=rm.data.from_numpy(X, y))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raymodel import backends, contract, data, exceptions  # noqa: F401 - backends: the plug-ins register themselves
from raymodel.exceptions import (
    CheckpointError,
    ChecksumError,
    DataError,
    HookError,
    MissingDependencyError,
    ModelDefinitionError,
    RayModelError,
    RegistryError,
    ServeError,
    SettingsError,
    TrainingError,
    TuneError,
)
from raymodel.hooks import Callback, RunContext

# The training server's client: importing it provides the drivers' `TrainingServer` port (raymodel.contract).
from raymodel.jobs import init
from raymodel.model import RayModel
from raymodel.train import DPO, GRPO, Trainable, TrainResult, TrainSettings

if TYPE_CHECKING:  # the names `__getattr__` gives on first use, as a type checker sees them
    from raymodel import callbacks as callbacks, k8s as k8s, registry as registry, serve as serve, tune as tune
    from raymodel.backends.lightgbm import RayLightGBMModel as RayLightGBMModel
    from raymodel.backends.lightning import RayLightningModel as RayLightningModel
    from raymodel.backends.rllib import RayRLlibModel as RayRLlibModel
    from raymodel.backends.tensorflow import RayTensorflowModel as RayTensorflowModel
    from raymodel.backends.torch import RayTorchModel as RayTorchModel
    from raymodel.backends.transformers import LoRA as LoRA, RayTransformersModel as RayTransformersModel
    from raymodel.backends.xgboost import RayXGBoostModel as RayXGBoostModel
    from raymodel.jobs import Gate as Gate, Job as Job, ReleaseResult as ReleaseResult, RolloutPlan as RolloutPlan
    from raymodel.predict import Predictions as Predictions, predict_batch as predict_batch
    from raymodel.registry import ModelRef as ModelRef
    from raymodel.serve import (
        Guard as Guard,
        Servable as Servable,
        ServedModel as ServedModel,
        ServeSettings as ServeSettings,
    )
    from raymodel.tune import Tunable as Tunable, TuneResult as TuneResult, TuneSettings as TuneSettings
    from raymodel.web import dashboard as dashboard


def _version() -> str:
    """The installed distribution's version: one source, ``pyproject.toml``."""
    from importlib import metadata

    try:
        return metadata.version("raymodel")
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


__version__ = _version()


# Submodules and classes that import Ray Tune / Serve only when first used.
_LAZY = {
    "tune": ("raymodel.tune", None),
    "serve": ("raymodel.serve", None),
    "registry": ("raymodel.registry", None),
    "callbacks": ("raymodel.callbacks", None),
    "k8s": ("raymodel.k8s", None),
    "Job": ("raymodel.jobs", "Job"),
    "predict_batch": ("raymodel.predict", "predict_batch"),
    "Predictions": ("raymodel.predict", "Predictions"),
    "dashboard": ("raymodel.web", "dashboard"),
    "Tunable": ("raymodel.tune", "Tunable"),
    "Servable": ("raymodel.serve", "Servable"),
    "TuneSettings": ("raymodel.tune", "TuneSettings"),
    "TuneResult": ("raymodel.tune", "TuneResult"),
    "ServeSettings": ("raymodel.serve", "ServeSettings"),
    "ServedModel": ("raymodel.serve", "ServedModel"),
    "Guard": ("raymodel.serve", "Guard"),
    "Gate": ("raymodel.jobs", "Gate"),
    "RolloutPlan": ("raymodel.jobs", "RolloutPlan"),
    "ReleaseResult": ("raymodel.jobs", "ReleaseResult"),
    "ModelRef": ("raymodel.registry", "ModelRef"),
    "LoRA": ("raymodel.backends.transformers", "LoRA"),
}


def __getattr__(name: str) -> Any:
    if name.startswith("Ray") and name.endswith("Model"):
        # The model base classes come from the backend table (raymodel/contract/_table.py), which
        # the plug-ins pushed themselves into; each imports its framework on first access, and a
        # missing one names the extra to install.
        model_class: Any = contract.model_classes().get(name)
        if model_class is not None:
            model_class.backend.import_framework()
            globals()[name] = model_class
            return model_class
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raymodel' has no attribute {name!r}")


def _backend_names() -> list[str]:
    return sorted(contract.model_classes())  # the built-in backends' model classes (no framework imported)


__all__ = [
    "RayModel",
    *_backend_names(),
    "Callback",
    "RunContext",
    "Trainable",
    "Tunable",
    "Servable",
    "TrainSettings",
    "TrainResult",
    "TuneSettings",
    "TuneResult",
    "ServeSettings",
    "ServedModel",
    "Guard",
    "Gate",
    "RolloutPlan",
    "ReleaseResult",
    "ModelRef",
    "LoRA",
    "GRPO",
    "DPO",
    "tune",
    "serve",
    "registry",
    "jobs",
    "Job",
    "predict_batch",
    "Predictions",
    "callbacks",
    "k8s",
    "dashboard",
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
