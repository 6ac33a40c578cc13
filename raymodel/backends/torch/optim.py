"""What a torch model's ``configure_optimizers`` returned, in any of its forms, as optimizers and
LR schedulers that know when they step (per epoch or per step, on a monitored metric)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from raymodel.exceptions import ModelDefinitionError


@dataclasses.dataclass
class SchedulerConfig:
    """An LR scheduler and when it steps (Lightning's ``lr_scheduler`` dict)."""

    scheduler: Any
    interval: str = "epoch"  # or "step"
    monitor: str | None = None  # the metric a ReduceLROnPlateau steps on

    def step(self, metrics: dict[str, float] | None = None) -> None:
        if self.monitor is None:
            self.scheduler.step()
            return
        if not metrics or self.monitor not in metrics:
            raise ModelDefinitionError(
                f"The LR scheduler monitors `{self.monitor}`, which the epoch did not "
                f"report (it reported {sorted(metrics or {})})."
            )
        self.scheduler.step(metrics[self.monitor])


def configure_optimizers(model: Any) -> tuple[list[Any], list[SchedulerConfig]]:
    """The optimizers and LR schedulers of ``configure_optimizers``, in any of its forms:
    an optimizer, a list of them, ``(optimizer(s), scheduler(s))``, or a Lightning-style dict."""
    configured = model.configure_optimizers()
    schedulers: Any = None
    if isinstance(configured, dict):
        if "optimizer" not in configured:
            raise ModelDefinitionError("`configure_optimizers` returned a dict without an `optimizer` key.")
        configured, schedulers = configured["optimizer"], configured.get("lr_scheduler")
    elif isinstance(configured, tuple) and len(configured) == 2 and _are_schedulers(configured[1]):
        configured, schedulers = configured
    optimizers = list(configured) if isinstance(configured, (list, tuple)) else [configured]
    if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise ModelDefinitionError(
            "`configure_optimizers` must return a `torch.optim.Optimizer`, a list of them, "
            "`(optimizer, scheduler)`, or `{'optimizer': ..., 'lr_scheduler': ...}` "
            f"(got {configured!r})."
        )
    items = schedulers if isinstance(schedulers, (list, tuple)) else [] if schedulers is None else [schedulers]
    return optimizers, [_scheduler_config(item) for item in items]


def _are_schedulers(value: Any) -> bool:
    items = value if isinstance(value, (list, tuple)) else [value]
    return bool(items) and all(isinstance(i, dict) or hasattr(i, "optimizer") and hasattr(i, "step") for i in items)


def _scheduler_config(item: Any) -> SchedulerConfig:
    if isinstance(item, dict):
        if "scheduler" not in item or item.get("interval", "epoch") not in ("epoch", "step"):
            raise ModelDefinitionError(
                f"An `lr_scheduler` dict needs a `scheduler` and an `interval` of 'epoch' or 'step' (got {item!r})."
            )
        return SchedulerConfig(item["scheduler"], item.get("interval", "epoch"), item.get("monitor"))
    monitor = "val_loss" if type(item).__name__ == "ReduceLROnPlateau" else None
    return SchedulerConfig(item, "epoch", monitor)


#: Config keys that ``job.update`` sets on every param group of every optimizer that has them.
HYPERPARAMETERS = ("lr", "weight_decay", "momentum", "betas", "eps")


def set_hyperparameters(optimizers: Any, changes: dict[str, Any]) -> None:
    """Set the changed hyperparameters on each param group that has them (torch reads them at each
    step). A scheduler that sets ``lr`` itself sets it again at its next step."""
    for opt in optimizers or ():
        for group in opt.param_groups:
            for key in HYPERPARAMETERS:
                if key in changes and key in group:
                    value = changes[key]
                    group[key] = tuple(value) if isinstance(value, list) else value
            if "lr" in changes and "initial_lr" in group:  # what a scheduler counts from
                group["initial_lr"] = changes["lr"]
