"""The one place raymodel uses RLlib's private API (Ray 2.60.0's RLlib).

``job.update(config={"lr": ...})`` changes a running Algorithm's learning rate. RLlib's public API
reaches the optimizers (``Learner.get_optimizers_for_module``), and torch's ``param_groups`` set the
rate; but after every update the Learner sets each optimizer's rate again from the schedule it built
from ``AlgorithmConfig.lr`` (``Learner._optimizer_lr_schedules``, read in
``after_gradient_based_update``), and no public method replaces that schedule once the Algorithm is
built (``AlgorithmConfig.lr`` is read at build time only). So the schedule is replaced here, by its
private attribute: the public API that is missing is a ``Learner.set_lr(module_id, lr)`` (or a
schedule setter). Check this module when RLlib is upgraded.
"""

from __future__ import annotations

from typing import Any


def replace_lr_schedule(learner: Any, optimizer: Any, lr: float) -> None:
    """From now on ``optimizer``'s rate stays ``lr`` after each of ``learner``'s updates."""
    from ray.rllib.utils.schedules.scheduler import Scheduler

    schedules = learner._optimizer_lr_schedules
    if optimizer in schedules:  # RLlib keeps a schedule only for optimizers it registered with one
        schedules[optimizer] = Scheduler(lr, framework="torch", device=learner._device)
