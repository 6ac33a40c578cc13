"""The RLlib side of ``RayRLlibModel``: an ``RLModule`` that wraps the user's own networks, and the env
creator every env runner calls.

RLlib's new API stack builds its ``RLModule`` from an ``RLModuleSpec`` on the learner and on every env
runner. ``UserNetworks`` builds a fresh instance of the user's class there (the class travels by value
in ``model_config["raymodel"]``), runs its ``setup(config)`` and holds its ``torch.nn`` modules under
their own attribute names, so the RLModule's state keys are the networks' own (``pi.0.weight``): the
user's instance loads them as they are. ``_forward`` is the user's ``forward`` (action-distribution
inputs), ``compute_values`` (``ValueFunctionAPI``) the user's ``value``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule

from raymodel._internal import serialization


def user_instance(blob: bytes) -> Any:
    """A set-up instance of the user's class from ``(class, config)`` pickled by value."""
    cls, config = serialization.loads(blob)
    model = cls(config=config)
    model.ensure_setup()
    return model


def make_env(env_config: dict[str, Any]) -> Any:
    """RLlib's env creator: the user's ``make_env(config)`` on a fresh instance (no networks built)."""
    cls, config = serialization.loads(env_config["raymodel"])
    return cls(config=config).make_env(dict(config))


class UserNetworks(TorchRLModule, ValueFunctionAPI):
    """An RLModule whose networks are the user's: ``setup`` builds them with the user's ``setup``."""

    def setup(self) -> None:
        options = cast("dict[str, Any]", self.model_config)  # `algo_config`'s: the user's class and config
        model = user_instance(options["raymodel"])
        self._user = model
        modules = {k: v for k, v in vars(model).items() if isinstance(v, torch.nn.Module)}
        for name, module in modules.items():
            setattr(self, name, module)  # registered: their parameters are the RLModule's, keys unchanged
        self._has_value = bool(options.get("has_value"))

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self._user.forward(batch[Columns.OBS])}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> Any:
        return self._user.value(batch[Columns.OBS])

    def user_modules(self) -> dict[str, torch.nn.Module]:
        """The user's networks by attribute name."""
        return {k: v for k, v in vars(self._user).items() if isinstance(v, torch.nn.Module)}
