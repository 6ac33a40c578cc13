"""The errors raymodel raises. Every one of them is a ``RayModelError``."""

from __future__ import annotations


class RayModelError(Exception):
    """Base class of every error raised by raymodel."""


class SettingsError(RayModelError, ValueError):
    """A settings object or dict has an unknown key or a bad value."""


class ModelDefinitionError(RayModelError, TypeError):
    """A model class is missing a method it must define, or defines it wrongly."""


class DataError(RayModelError, ValueError):
    """The data given to a verb is missing, of an unsupported type, or of the wrong shape."""


class MissingDependencyError(RayModelError, ImportError):
    """An optional framework is not installed; the message names the extra to install."""


class HookError(RayModelError):
    """A hook, callback or step raised; the original error is the ``__cause__``."""


class CheckpointError(RayModelError):
    """A checkpoint directory is missing, unreadable or not a raymodel checkpoint."""


class ChecksumError(CheckpointError):
    """A checkpoint file does not match the sha256 recorded in its manifest."""


class TrainingError(RayModelError):
    """A training run failed on the Ray workers."""


class TuneError(RayModelError):
    """A tuning experiment failed or reported no usable trial."""


class ServeError(RayModelError):
    """A model could not be deployed, or a served model failed."""


class RegistryError(RayModelError, LookupError):
    """A registry key, version or alias does not exist, or a version cannot be written."""


__all__ = [
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
