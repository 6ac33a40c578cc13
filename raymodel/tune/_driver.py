"""``Tunable``, behind ``model.tune()``: a Ray Tune ``Tuner`` whose trials are training runs."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import TYPE_CHECKING, Any, Mapping

from ray.tune import Callback
from ray.tune.search import SearchAlgorithm

from raymodel._internal import locations, serialization, storage
from raymodel._ray import cluster
from raymodel.contract import OwnRuns, RayTrain, training_server
from raymodel.exceptions import SettingsError, TuneError
from raymodel.train import prepare, worker_resources
from raymodel.tune._progress import TrialPrinter, summary_table
from raymodel.tune._reported import is_reported
from raymodel.tune._result import TuneResult, collect
from raymodel.tune._settings import TuneSettings
from raymodel.tune._trial import PLACEMENT_FIELDS, TRAIN_PREFIX, on_pool, resources_of, trial, trial_resources

if TYPE_CHECKING:
    from raymodel.contract import Model


class Tunable:
    """A model, a search space, tuning settings and data, checked and ready for Ray Tune.

    ``fit()`` is ``model.tune(space, settings=..., data=...)``; ``as_trainable()``
    is a Ray Tune function trainable (with its resources attached) for your own
    ``tune.Tuner``, with any scheduler or searcher; ``as_tuner()`` is the native
    ``tune.Tuner``, not yet fit. Each trial is one training run of the model
    (Train is the base; Tune calls Train): its config keys are the model's
    config keys, and a key ``"train.<field>"`` sets that ``TrainSettings``
    field for the trial (``"train.batch_size": rm.tune.choice([32, 128])``).

    Args:
        model: The model whose class and config the trials start from.
        space: ``{config key: rm.tune.<sampler>}`` merged over ``model.config``;
            ``None`` uses ``model.hyperparameter_space()``.
        settings: A ``TuneSettings`` or a dict of its fields.
        data: As for ``model.train``.
        resume: Continue an interrupted experiment of the same ``settings.name``.

    Example:
        >>> u = rm.Tunable(model, {"lr": rm.tune.loguniform(1e-4, 1e-2)}, data=data)
        >>> tuner = tune.Tuner(u.as_trainable(), param_space={"lr": tune.loguniform(1e-4, 1e-2)},
        ...                    tune_config=tune.TuneConfig(scheduler=ASHAScheduler(time_attr="epoch",
        ...                                                metric="val_loss", mode="min"), num_samples=8))
        >>> tuner.fit()
    """

    def __init__(
        self,
        model: Model,
        space: Mapping[str, Any] | None = None,
        *,
        settings: Any = None,
        data: Any,
        resume: bool = False,
    ) -> None:
        self.model = model
        self.settings = settings = TuneSettings.coerce(settings)
        train_settings = dataclasses.replace(
            settings.train,
            num_epochs=settings.max_epochs,
            progress=False,
            verbose=settings.verbose,
            priority=settings.priority,  # a trial's job on the server: the tune job's place in the queue
            preemptible=settings.preemptible,
        )
        self.train_settings, self.spec = prepare(model, train_settings, data)
        space = model.hyperparameter_space() if space is None else space
        if not isinstance(space, Mapping):
            raise SettingsError(f"`space` must be a dict of config keys to `rm.tune` samplers (got {space!r}).")
        _check_train_keys(space)
        self.space = dict(space)
        default = model.backend.default_metric
        if settings.metric is None and default is not None:  # the backend's own (RL: the mean return, max)
            self.settings = settings = dataclasses.replace(settings, metric=default[0], mode=default[1])
        self.metric = settings.metric or ("loss" if self.spec.has_validation is False else "val_loss")
        if self.metric.startswith("val_") and self.spec.has_validation is False:
            raise SettingsError(
                f"`metric={self.metric!r}` is a validation metric, but the data has no `valid` split, so only "
                "`loss` is reported. Add a validation split (e.g. `rm.data.from_numpy(X, y, valid_fraction=0.2)`) "
                "or tune on `metric='loss'`."
            )
        self.name = settings.name or locations.run_name(f"{type(model).__name__}-tune")
        self.storage = settings.storage_path or locations.runs_root()
        self.path = storage.join(self.storage, self.name)
        self.resume = resume
        _check_experiment_path(self.path, self.name, resume, named=settings.name is not None)
        self._guard = MetricGuard(self.metric)
        #: A Tune ``Stopper`` (or stop criteria) for the experiment; a job's stop uses it.
        self.stop: Any = None

    @property
    def trials_on_pools(self) -> bool:
        """Whether trials run their training as jobs of the training server, on pools (several workers
        each, or ``train.num_workers`` tuned, with settings that go to a pool)."""
        ts = self.train_settings
        if isinstance(self.model.backend.training, OwnRuns):  # RLlib: the trial holds its Algorithm and env runners
            return False
        return ts.on_pool and (ts.max_workers > 1 or f"{TRAIN_PREFIX}num_workers" in self.space)

    @property
    def trial_needs(self) -> dict[str, float]:
        """What a trial holds while it runs: its one worker's resources, or a sliver plus the worker
        group it starts itself (a worker group on a pool is a job of the server, holding its own)."""
        ts, backend = self.train_settings, self.model.backend
        needs = trial_resources(backend, **{n: getattr(ts, n) for n in PLACEMENT_FIELDS})
        if ts.max_workers > 1 and isinstance(backend.training, RayTrain) and not on_pool(ts, backend):
            for k, v in worker_resources(ts.resources_per_worker, ts.use_gpu).items():
                needs[k] = needs.get(k, 0.0) + v * ts.max_workers
        return needs

    def as_trainable(self) -> Any:
        """A Ray Tune function trainable: each call trains the model with its trial's config."""
        cluster.ensure_ray(self.settings.verbose)
        from ray import tune

        payload = serialization.dumps(
            {"class": type(self.model), "train": self.train_settings, "storage": self.storage},
            type(self.model),
            *self.train_settings.callbacks,
        )
        trainable = tune.with_parameters(trial, payload=payload, data=self.spec.for_workers())
        # One worker: the trial trains in its own process and holds that worker's resources.
        base = {name: getattr(self.train_settings, name) for name in PLACEMENT_FIELDS}
        # A function of the trial's config (`train.*` placement may be tuned) returning its placement group.
        # Tune pickles it with the trainable: the backend goes by value (a backend defined beside the
        # model, in a module the trial's worker cannot import, must still load there).
        backend = serialization.dumps(self.model.backend, self.model.backend)
        return tune.with_resources(trainable, functools.partial(resources_of, base, backend))

    def as_tuner(self) -> Any:
        """The native ``tune.Tuner`` (or ``Tuner.restore`` with ``resume=True``), not yet fit."""
        from ray import tune

        settings = self.settings
        trainable = self.as_trainable()
        param_space = {**self.model.config, **self.space}
        callbacks = [self._guard, _TrialJobs(), *settings.callbacks]
        if settings.progress:
            grid = math.prod(
                len(v["grid_search"]) for v in self.space.values() if isinstance(v, dict) and "grid_search" in v
            )
            callbacks.insert(
                0,
                TrialPrinter(
                    type(self.model).__name__,
                    list(self.space),
                    self.metric,
                    settings.max_epochs,
                    total=settings.num_samples * grid,
                ),
            )
        if self.resume:
            return tune.Tuner.restore(
                self.path, trainable=trainable, param_space=param_space, resume_unfinished=True, resume_errored=True
            )
        at_once = settings.max_concurrent_trials or _fits_at_once(self.train_settings, self.model.backend)
        search_alg = _searcher(settings, at_once)
        tune_config = tune.TuneConfig(
            metric=self.metric,
            mode=settings.mode,
            num_samples=settings.num_samples,
            scheduler=_scheduler(settings, self.space),
            search_alg=search_alg,
            # Tune limits a `Searcher`'s concurrency itself but ignores the limit for a
            # `SearchAlgorithm` (such as the default generator, which takes it directly).
            max_concurrent_trials=None if isinstance(search_alg, SearchAlgorithm) else at_once,
            time_budget_s=settings.time_budget_s,
            reuse_actors=True,
        )
        run_config = tune.RunConfig(
            name=self.name,
            storage_path=self.storage,
            callbacks=callbacks,
            verbose=1 if settings.verbose else 0,
            stop=self.stop,
        )
        return tune.Tuner(trainable, param_space=param_space, tune_config=tune_config, run_config=run_config)

    def fit(self) -> TuneResult:
        """Run the experiment; afterwards the model holds the best trial's config and weights."""
        tuner = self.as_tuner()
        ts, backend = self.train_settings, self.model.backend
        if not on_pool(ts, backend):  # trials that hold resources themselves: idle pools make room
            training_server().make_room(trial_resources(backend, **{n: getattr(ts, n) for n in PLACEMENT_FIELDS}))
        results = _fit(tuner, self._guard)
        result = collect(results, self.metric, self.settings, list(self.space), self.path, self.storage)
        if self.settings.progress:
            print(
                f"[{type(self.model).__name__}] {result.num_trials} trials; best {self.metric} "
                f"{result.best_metrics.get(self.metric, float('nan')):.4f}:\n"
                + summary_table(result.trials, list(self.space), self.metric, self.settings.mode),
                flush=True,
            )
        load_best(self.model, result)
        return result

    def __repr__(self) -> str:
        return f"Tunable({type(self.model).__name__}, space={sorted(self.space)}, name={self.name!r})"


class _TrialJobs(Callback):
    """A trial that ends (ASHA's stop, its last epoch, an error) stops the training server's job it
    ran, if any: the trial's own thread may be left waiting in ``tune.report`` and never get to it."""

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        _stop_trial_jobs(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        _stop_trial_jobs(trial.trial_id)


def _stop_trial_jobs(trial_id: str) -> None:
    training_server().stop_trial_jobs(trial_id)


#: ``TrainSettings`` fields a trial may not set through ``"train.<field>"`` (Tune decides them).
_FIXED_TRAIN_FIELDS = ("name", "storage_path", "progress", "callbacks", "verbose")


def _check_train_keys(space: Mapping[str, Any]) -> None:
    import dataclasses as dc

    from raymodel.train import TrainSettings

    fields = [f.name for f in dc.fields(TrainSettings) if f.name not in _FIXED_TRAIN_FIELDS]
    bad = [
        k for k in space if isinstance(k, str) and k.startswith(TRAIN_PREFIX) and k[len(TRAIN_PREFIX) :] not in fields
    ]
    if bad:
        raise SettingsError(
            f"{bad[0]!r} names no tunable training setting; a `train.` key is one of: "
            + ", ".join(f"`train.{f}`" for f in fields)
            + "."
        )


def _fit(tuner: Any, guard: MetricGuard) -> Any:
    """``tuner.fit()``, with a missing metric reported by name instead of Tune's result dump."""
    previous = os.environ.get("TUNE_DISABLE_STRICT_METRIC_CHECKING")
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # MetricGuard checks instead
    try:
        return tuner.fit()
    except Exception as exc:
        if guard.reported is not None:
            raise guard.error() from None
        raise TuneError(f"The tuning experiment failed: {exc}") from exc
    finally:
        if previous is None:
            os.environ.pop("TUNE_DISABLE_STRICT_METRIC_CHECKING", None)
        else:
            os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = previous


class MetricGuard(Callback):
    """Stops the experiment at the first result without the tuned metric."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.reported: list[str] | None = None

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        if self.metric not in result:
            self.reported = sorted(k for k in result if is_reported(k))
            raise self.error()

    def error(self) -> TuneError:
        return TuneError(
            f"No trial reported `{self.metric}`. The model reports: {self.reported}. "
            f"Set `TuneSettings(metric=...)` to one of those."
        )


def _check_experiment_path(path: str, name: str, resume: bool, named: bool) -> None:
    from ray import tune

    if resume and not tune.Tuner.can_restore(path):
        raise TuneError(
            f"Nothing to resume at `{path}`: no experiment of that name was started there. "
            "Pass the `name` (and `storage_path`) of the interrupted experiment."
        )
    if not resume and named and storage.exists(path):
        raise SettingsError(
            f"An experiment named `{name}` already exists at `{path}`. Continue it with "
            "`resume=True`, or choose another `name`."
        )


def _scheduler(settings: TuneSettings, space: dict[str, Any]) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    if settings.scheduler == "asha":
        return ASHAScheduler(
            time_attr="epoch",
            max_t=settings.max_epochs,
            grace_period=settings.grace_period,
            reduction_factor=settings.reduction_factor,
        )
    if settings.scheduler == "fifo":
        return FIFOScheduler()
    if settings.scheduler == "pbt":
        # An exploiting trial continues from the donor's checkpoint with a mutation of the space. Synchronous:
        # trials wait for each other at each perturbation, so a population that does not all fit at once,
        # or whose trials start at different times, still exploits.
        return PopulationBasedTraining(
            time_attr="epoch",
            perturbation_interval=settings.perturbation_interval,
            hyperparam_mutations=space,
            synch=True,
        )
    return settings.scheduler


def _searcher(settings: TuneSettings, at_once: int) -> Any:
    if settings.search_alg is not None:
        return settings.search_alg
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=settings.seed, max_concurrent=at_once)


def _fits_at_once(train_settings: Any, backend: Any) -> int:
    """How many trials the cluster's CPUs hold at once, given each trial's workers."""
    import ray

    cpus = float(ray.cluster_resources().get("CPU", 1))
    held = trial_resources(backend, **{n: getattr(train_settings, n) for n in PLACEMENT_FIELDS}).get("CPU", 0.0)
    if isinstance(backend.training, RayTrain):
        per_worker = float((train_settings.resources_per_worker or {}).get("CPU", 1))
        workers = max(train_settings.num_workers, 1)
        per_trial = workers * per_worker + held * (workers > 1)
    else:  # the trial holds its whole run
        per_trial = max(held, 0.01)
    return max(1, math.floor(cpus / per_trial + 1e-9))


def load_best(model: Model, result: TuneResult) -> None:
    """The instance takes the best trial's config (without its ``train.`` settings) and weights."""
    model.config = {k: v for k, v in result.best_config.items() if not k.startswith(TRAIN_PREFIX)}
    model._is_setup = False
    if result.best_checkpoint:
        model.load_weights(result.best_checkpoint)
