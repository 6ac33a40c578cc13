"""``TuneSettings``: how to search."""

from __future__ import annotations

from typing import Any, Sequence

from raymodel._internal.settings import (
    MAX_SEED,
    SettingsBase,
    check_choice,
    check_int,
    check_name,
    check_number,
    check_type,
    collect,
    settings_class,
)
from raymodel.train import TrainSettings


@settings_class
class TuneSettings(SettingsBase):
    """How to run ``model.tune()``. Keyword-only; a plain dict is accepted too.

    Attributes:
        num_samples: Trials to run (each samples the space once; a
            ``grid_search`` multiplies them, as in Ray Tune).
        metric: The metric to optimize; default ``"val_loss"`` when the data has
            a validation split, else ``"loss"``.
        mode: ``"min"`` or ``"max"``.
        max_epochs: Epochs a trial may run at most (ASHA's ``max_t``).
        scheduler: ``"asha"`` (default), ``"fifo"``, ``"pbt"`` (Population Based Training over
            the space: an exploiting trial continues from the donor's checkpoint with a
            mutated config), or any Ray Tune scheduler object.
        grace_period: Epochs every trial runs before ASHA may stop it.
        reduction_factor: ASHA's halving rate (keep the top 1/``reduction_factor``).
        perturbation_interval: PBT's exploit/explore period, in epochs.
        search_alg: Any Ray Tune searcher (e.g. ``BasicVariantGenerator``, Optuna, HyperOpt).
        time_budget_s: Stop the whole experiment after this many seconds.
        max_concurrent_trials: Trials at once; default: as many as the cluster's
            CPUs fit, given each trial's workers and ``resources_per_worker``.
        train: The ``TrainSettings`` of each trial (its ``num_epochs`` is set to
            ``max_epochs``); trials can themselves run on several workers.
        callbacks: Ray Tune ``Callback`` objects, run on the driver.
        name: Experiment name (one folder name: letters, digits, ``_-.``; to resume it later);
            default: class name + time.
        storage_path: Where experiments are written; default ``$RAYMODEL_HOME/runs``.
        seed: Seed of the default random search, for repeatable experiments.
        verbose: Show Ray's own logs and Tune's status table.
        progress: Print a line per finished trial and a summary table.
        priority: The training server's queue order for this tune job and its
            trials' jobs (higher first; see ``TrainSettings.priority``).
        preemptible: Whether a higher-priority job may preempt this job's trials,
            one by one (each resumes from its checkpoint).
    """

    num_samples: int = 8
    metric: str | None = None
    mode: str = "min"
    max_epochs: int = 10
    scheduler: Any = "asha"
    grace_period: int = 1
    reduction_factor: float = 3
    perturbation_interval: int = 2
    search_alg: Any = None
    time_budget_s: float | None = None
    max_concurrent_trials: int | None = None
    train: Any = None
    callbacks: Sequence[Any] = ()
    name: str | None = None
    storage_path: str | None = None
    seed: int | None = 0
    verbose: bool = False
    progress: bool = True
    priority: int = 0
    preemptible: bool = True

    def _validate(self) -> list[str]:
        if isinstance(self.callbacks, list):
            object.__setattr__(self, "callbacks", tuple(self.callbacks))
        problems = collect(
            check_int("num_samples", self.num_samples, minimum=1),
            check_type("metric", self.metric, (str,), "a metric name such as 'val_loss'", allow_none=True),
            check_choice("mode", self.mode, ("min", "max")),
            check_int("max_epochs", self.max_epochs, minimum=1),
            check_int("grace_period", self.grace_period, minimum=1),
            check_number("reduction_factor", self.reduction_factor, minimum=1, exclusive_min=True),
            check_int("perturbation_interval", self.perturbation_interval, minimum=1),
            check_number("time_budget_s", self.time_budget_s, minimum=0, exclusive_min=True, allow_none=True),
            check_int("max_concurrent_trials", self.max_concurrent_trials, minimum=1, allow_none=True),
            check_name("name", self.name),
            check_type("storage_path", self.storage_path, (str,), "a path or URI string", allow_none=True),
            check_int("seed", self.seed, minimum=0, maximum=MAX_SEED, allow_none=True),
            check_type("verbose", self.verbose, (bool,), "True or False"),
            check_type("progress", self.progress, (bool,), "True or False"),
            check_int("priority", self.priority),
            check_type("preemptible", self.preemptible, (bool,), "True or False"),
        )
        if isinstance(self.scheduler, str):
            problems += collect(check_choice("scheduler", self.scheduler, ("asha", "fifo", "pbt")))
        elif not _is_tune_scheduler(self.scheduler):
            problems.append(
                f"`scheduler` must be 'asha', 'fifo', 'pbt' or a Ray Tune scheduler object (got {self.scheduler!r})."
            )
        if self.search_alg is not None and not _is_tune_searcher(self.search_alg):
            problems.append(
                f"`search_alg` must be a Ray Tune `Searcher` or `SearchAlgorithm` (got {self.search_alg!r})."
            )
        if (
            isinstance(self.scheduler, str)
            and self.scheduler == "asha"
            and isinstance(self.grace_period, int)
            and isinstance(self.max_epochs, int)
            and self.grace_period > self.max_epochs
        ):
            problems.append(f"`grace_period` ({self.grace_period}) must be <= `max_epochs` ({self.max_epochs}).")
        if not isinstance(self.callbacks, tuple):
            problems.append(f"`callbacks` must be a list of `ray.tune.Callback` (got {self.callbacks!r}).")
        try:
            object.__setattr__(self, "train", TrainSettings.coerce(self.train))
        except Exception as exc:  # noqa: BLE001 - any error of the nested settings, named by its field
            problems.append(f"`train`: {exc}")
        else:
            if self.train.elastic:
                problems.append(
                    f"`train.num_workers={self.train.num_workers!r}`: a trial has a fixed number of workers "
                    "(Tune places each trial once); elastic ranges are for `model.train`."
                )
            if self.train.strategy == "fsdp" and self.train.num_workers == 1:
                problems.append(
                    "`train.strategy='fsdp'` with `num_workers=1`: a one-worker trial trains inside Tune's trial "
                    "process, which has no process group to shard over. Use `num_workers=2` or more, or 'ddp'."
                )
        return problems


def _is_tune_scheduler(obj: Any) -> bool:
    from ray.tune.schedulers import TrialScheduler

    return isinstance(obj, TrialScheduler)


def _is_tune_searcher(obj: Any) -> bool:
    from ray.tune.search import SearchAlgorithm, Searcher

    return isinstance(obj, (Searcher, SearchAlgorithm))
