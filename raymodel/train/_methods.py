"""How a language model is trained, chosen per training call (``TrainSettings.method``): supervised (the
default, ``None``), with rewards (``GRPO``) or with preferences (``DPO``). TRL's trainers do the work on
each Ray Train worker (``raymodel.backends.transformers``); these are their settings, checked before any
resource is taken."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from raymodel._internal.settings import SettingsBase, check_choice, check_int, check_number, collect, settings_class

#: TRL's GRPO losses (``GRPOConfig.loss_type``).
GRPO_LOSSES = ("dapo", "grpo", "dr_grpo", "bnpo")


@settings_class
class GRPO(SettingsBase):
    """Group Relative Policy Optimization with rewards the model's class computes (TRL's ``GRPOTrainer``).

    Each prompt of a step is completed ``num_generations`` times (a group); each completion's reward, less
    its group's mean, weighs its tokens' log-probabilities. The class gives ``reward(self, prompts,
    completions, **columns)`` (columns of the data by name), a list of floats (``None`` skips one), or
    several such methods named in ``rewards`` with their weights: a completion's reward is their weighted
    sum (TRL's ``reward_weights``), and each one's mean is a figure of the rows (``reward_<name>``).

    ``TrainSettings.batch_size`` is completions per worker and step, as TRL's per-device batch: the
    completions of one step over all workers (``batch_size * num_workers``) hold whole groups, so they
    must divide by ``num_generations``.

    Attributes:
        num_generations: Completions per prompt (the group), at least 2.
        beta: Weight of the KL divergence to the reference: with a LoRA adapter, the base with the
            adapter off (no second copy). 0 leaves the reference out.
        max_completion_length: Tokens a completion may have.
        temperature: Sampling temperature of the completions.
        loss_type: TRL's loss: ``"dapo"`` (its default), ``"grpo"``, ``"dr_grpo"``, ``"bnpo"``.
        rewards: The class's reward methods by name, each with its weight (``{"correct": 1.0,
            "formatted": 0.2}``); ``None``: the class's ``reward`` alone.
    """

    num_generations: int = 8
    beta: float = 0.0
    max_completion_length: int = 64
    temperature: float = 1.0
    loss_type: str = "dapo"
    rewards: Mapping[str, float] | None = None

    kind = "grpo"
    #: Settings a model's config may give a run (``model.tune`` searches them as it does ``lr``).
    tunable = ("beta", "num_generations", "temperature")

    def _validate(self) -> list[str]:
        return collect(
            check_int("num_generations", self.num_generations, minimum=2),
            check_number("beta", self.beta, minimum=0),
            check_int("max_completion_length", self.max_completion_length, minimum=1),
            check_number("temperature", self.temperature, minimum=0, exclusive_min=True),
            check_choice("loss_type", self.loss_type, GRPO_LOSSES),
            _check_rewards(self.rewards),
        )

    @property
    def weights(self) -> dict[str, float]:
        """The reward methods by name, with their weights (``{"reward": 1.0}`` where ``rewards`` names none)."""
        return {"reward": 1.0} if self.rewards is None else {str(k): float(v) for k, v in self.rewards.items()}


def _check_rewards(rewards: Any) -> str | None:
    if rewards is None:
        return None
    example = '(e.g. `rewards={"correct": 1.0, "formatted": 0.2}`)'
    if not isinstance(rewards, Mapping) or not rewards:
        return f"`rewards` names the class's reward methods, each with its weight {example}; got {rewards!r}."
    for name, weight in rewards.items():
        if not isinstance(name, str) or not name.isidentifier():
            return f"`rewards` keys are the names of the class's reward methods {example}; got {name!r}."
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            return f"`rewards[{name!r}]` is a weight, a finite number {example}; got {weight!r}."
    return None


@settings_class
class DPO(SettingsBase):
    """Direct Preference Optimization on ``prompt``/``chosen``/``rejected`` rows (TRL's ``DPOTrainer``).

    Attributes:
        beta: How far the model may move from the reference (TRL's ``beta``): with a LoRA adapter the
            reference is the base with the adapter off.
        max_length: Tokens of a prompt and its answer together.
    """

    beta: float = 0.1
    max_length: int = 128

    kind = "dpo"
    tunable = ("beta",)

    def _validate(self) -> list[str]:
        return collect(
            check_number("beta", self.beta, minimum=0, exclusive_min=True),
            check_int("max_length", self.max_length, minimum=2),
        )


METHODS = (GRPO, DPO)


def with_config(method: Any, config: Mapping[str, Any]) -> Any:
    """``method`` with the settings a model's config gives (``config["beta"]``, a tune's sample of it, say)
    over its own; checked as the method's own are."""
    given = {k: config[k] for k in getattr(method, "tunable", ()) if k in config}
    return dataclasses.replace(method, **given) if given else method


def check_method(value: Any) -> str | None:
    """A problem with ``TrainSettings.method``, or ``None``."""
    if value is None or isinstance(value, METHODS):
        return None
    return (
        f"`method` is how a language model is trained: `None` (supervised), `rm.GRPO(...)` (rewards) or "
        f"`rm.DPO(...)` (preferences); got {value!r}."
    )
