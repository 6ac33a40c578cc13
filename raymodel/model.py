"""``RayModel``: the one class a user subclasses, and its four verbs."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping, TypeVar, overload

from raymodel._internal import signature, storage, tmp
from raymodel.contract import checkpoint as ckpt, defined, register
from raymodel.contract.schema import describe, schemas_of
from raymodel.exceptions import (
    CheckpointError,
    DataError,
    ModelDefinitionError,
    RayModelError,
    SettingsError,
)
from raymodel.hooks import ModelHooks, call_sync, is_default

if TYPE_CHECKING:
    from raymodel.contract import Backend
    from raymodel.hooks import RunContext
    from raymodel.jobs import Gate, Job, ReleaseResult, RolloutPlan
    from raymodel.predict import Predictions
    from raymodel.serve import ServedModel, ServeSettings
    from raymodel.train import TrainResult, TrainSettings
    from raymodel.tune import TuneResult, TuneSettings

M = TypeVar("M", bound="RayModel")


class RayModel(ModelHooks):
    """Base of every raymodel model. Subclass a backend's class, not this one.

    A subclass says *what* the model is (``setup``, ``forward``, the steps, the
    hooks); the verbs ``train``, ``tune``, ``serve`` (and ``raymodel.registry``)
    say *where and how much*. Construction is cheap: ``setup(config)`` runs
    lazily, in the process where the model is used.

    Args:
        config: Merged over the class's ``default_config`` (unknown keys are
            kept); the result is ``self.config``.
    """

    #: Defaults for ``self.config``; ``Model(config=...)`` is merged over it.
    default_config: ClassVar[Mapping[str, Any]] = {}
    #: The framework seam; set by each backend's model base class.
    backend: ClassVar[Backend]
    #: The request body a served model accepts: a pydantic model (or any type pydantic validates)
    #: or a JSON Schema dict. Checked before ``preprocess`` (422 naming each bad field's JSON path)
    #: and published at ``GET <route>/openapi.json``; ``None``: any JSON.
    input_schema: ClassVar[Any] = None
    #: What ``postprocess`` returns, likewise (a mismatch is the server's error: 500).
    output_schema: ClassVar[Any] = None
    #: The run this instance trains in (rank, epoch, ``should_stop``); ``None`` outside a run.
    context: RunContext | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "backend" in cls.__dict__:  # a backend's model base class: it pushes itself into the table
            register(cls)
        else:
            defined(cls)  # a user's model class: its backend is the one `rm.init`'s default warms

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        if config is not None and not isinstance(config, Mapping):
            raise SettingsError(
                f"`config` of `{type(self).__name__}` must be a dict of its settings, e.g. "
                f"`{type(self).__name__}(config={{'lr': 0.01}})` (got {_short(config)} that is a "
                f"{type(config).__name__})."
            )
        bad = [k for k in config or {} if not isinstance(k, str)]
        if bad:
            raise SettingsError(f"`config` keys of `{type(self).__name__}` must be strings (got {bad[0]!r}).")
        self.config: dict[str, Any] = {**copy.deepcopy(dict(self.default_config)), **dict(config or {})}
        self._is_setup = False
        #: Where the current weights came from (a checkpoint path or registry ref), if anywhere.
        self.source: dict[str, Any] = {}
        #: The shape beyond the rows and dtype of the inputs it was trained on (recorded at training, kept
        #: in its checkpoints); ``predict``, serving and ``predict_batch`` check requests against it.
        self.input_signature: dict[str, Any] | None = None

    # ------------------------------------------------------ user-defined parts
    def setup(self, config: dict[str, Any]) -> Any:
        """Build the native model(s) from ``config``. Runs wherever the model lives."""
        raise ModelDefinitionError(f"`{type(self).__name__}` must define `setup(self, config)`.")

    def forward(self, x: Any) -> Any:
        """Run the model on a batch ``x``. Each backend has a default."""
        return self.backend.inference.forward(self, x)

    def preprocess(self, payload: Any) -> Any:
        return self.backend.inference.preprocess(self, payload)

    def postprocess(self, output: Any) -> Any:
        return self.backend.inference.postprocess(self, output)

    def predict_batch_preprocess(self, batch: dict[str, Any]) -> Any:
        return self.backend.inference.batch_input(self, batch)

    def predict_batch_postprocess(self, output: Any) -> dict[str, Any]:
        return self.backend.inference.batch_output(self, output)

    def hyperparameter_space(self) -> dict[str, Any]:
        """The default search space of ``tune``: ``{config key: rm.tune.<sampler>}``."""
        return {}

    def __call__(self, x: Any) -> Any:
        return self.forward(x)

    # ------------------------------------------------------------ lifecycle
    @property
    def is_setup(self) -> bool:
        """True once ``setup(config)`` has run in this process."""
        return self._is_setup

    def ensure_setup(self) -> None:
        """Run ``before_setup``, ``setup(config)``, ``after_setup`` once, if not done yet."""
        if self._is_setup:
            return
        if not is_default(self, "before_setup"):
            call_sync(self.before_setup)
        try:
            returned = call_sync(self.setup, self.config)
        except RayModelError:
            raise
        except Exception as exc:  # a config value that setup cannot use: name the config, keep the cause
            raise ModelDefinitionError(
                f"`{type(self).__name__}.setup(config)` failed with config {_short(self.config, 200)}: "
                f"{type(exc).__name__}: {str(exc).rstrip('.')}. Check the config's values (their types and sizes)."
            ) from exc
        self.backend.after_user_setup(self, returned)
        self._is_setup = True
        if not is_default(self, "after_setup"):
            call_sync(self.after_setup)

    def predict(self, payload: Any) -> Any:
        """``postprocess(forward(preprocess(payload)))`` locally, in inference mode.

        A declared ``input_schema`` / ``output_schema`` is checked as when serving.

        Example:
            >>> model.predict({"pixels": X[:2].tolist()})
            {'digit': [0, 1]}
        """
        return _predict_here(self, payload)

    # ---------------------------------------------------------------- verbs
    @overload
    def train(
        self,
        settings: TrainSettings | Mapping[str, Any] | None = None,
        *,
        data: Any = None,
        wait: Literal[True] = True,
    ) -> TrainResult: ...

    @overload
    def train(
        self, settings: TrainSettings | Mapping[str, Any] | None = None, *, data: Any = None, wait: Literal[False]
    ) -> Job: ...

    @overload
    def train(
        self, settings: TrainSettings | Mapping[str, Any] | None = None, *, data: Any = None, wait: bool = True
    ) -> TrainResult | Job: ...

    def train(
        self, settings: TrainSettings | Mapping[str, Any] | None = None, *, data: Any = None, wait: bool = True
    ) -> TrainResult | Job:
        """Train on Ray Train workers; afterwards this instance holds the trained weights.

        The run is a job of the training server, on a resident worker group
        ("pool") that later runs reuse (``TrainSettings(pool=False)``: a one-off
        Ray Train run). This call waits and prints each epoch; with
        ``wait=False`` a ``Job`` is returned at once (``stream()``, ``stop()``,
        ``wait()``), and the run goes on without the calling process.

        Args:
            settings: A ``TrainSettings`` or a dict of its fields.
            data: ``rm.data.from_numpy(...)``, ``rm.data.from_pandas(...)``, a dict
                ``{"train": ..., "valid": ...}``, a torch ``Dataset``, a
                ``ray.data`` Dataset, or an object with ``setup(config)``
                returning such a dict.

        Returns:
            A ``TrainResult`` (metrics, history, checkpoints, path).

        Raises:
            SettingsError: a bad setting, before any Ray resource is taken.
            DataError: missing data or data of the wrong shape, likewise.
            TrainingError: the run failed on the workers.

        Example:
            >>> result = model.train(rm.TrainSettings(num_workers=2, num_epochs=5), data=data)
            >>> result.metrics["val_acc"]
            0.97
        """
        from raymodel.train import Trainable, TrainSettings

        settings = TrainSettings.coerce(settings)
        if not wait:
            from raymodel.jobs import submit_train

            return submit_train(self, settings, data)
        from raymodel._ray import remote

        if settings.on_pool or remote.active() is not None:  # off the cluster, the cluster's server runs it
            from raymodel.jobs import train_and_wait

            return train_and_wait(self, settings, data)
        return Trainable(self, settings, data=data).fit()

    @overload
    def tune(
        self,
        space: Mapping[str, Any] | None = None,
        *,
        settings: TuneSettings | Mapping[str, Any] | None = None,
        data: Any = None,
        resume: bool = False,
        wait: Literal[True] = True,
    ) -> TuneResult: ...

    @overload
    def tune(
        self,
        space: Mapping[str, Any] | None = None,
        *,
        settings: TuneSettings | Mapping[str, Any] | None = None,
        data: Any = None,
        resume: bool = False,
        wait: Literal[False],
    ) -> Job: ...

    @overload
    def tune(
        self,
        space: Mapping[str, Any] | None = None,
        *,
        settings: TuneSettings | Mapping[str, Any] | None = None,
        data: Any = None,
        resume: bool = False,
        wait: bool = True,
    ) -> TuneResult | Job: ...

    def tune(
        self,
        space: Mapping[str, Any] | None = None,
        *,
        settings: TuneSettings | Mapping[str, Any] | None = None,
        data: Any = None,
        resume: bool = False,
        wait: bool = True,
    ) -> TuneResult | Job:
        """Search hyperparameters with Ray Tune (ASHA by default); each trial is a ``train()`` run.

        With ``wait=False`` the experiment is a job of the training server (see ``train``).

        Afterwards this instance holds the best trial's config and weights.

        Args:
            space: ``{config key: rm.tune.<sampler>}`` merged over ``self.config``;
                ``None`` uses ``hyperparameter_space``.
            settings: A ``TuneSettings`` or a dict of its fields.
            data: As for ``train``.
            resume: Continue an interrupted experiment of the same ``settings.name``.

        Example:
            >>> tuned = model.tune(settings=rm.TuneSettings(num_samples=8, metric="val_loss"), data=data)
            >>> tuned.best_config
        """
        if not wait:
            from raymodel.jobs import submit_tune

            return submit_tune(self, space, settings, data, resume)
        from raymodel._ray import remote

        if remote.active() is not None:  # off the cluster: a job of the cluster's server, waited for
            from raymodel.jobs import tune_and_wait

            return tune_and_wait(self, space, settings, data, resume)
        from raymodel.tune import Tunable

        tunable = Tunable(self, space, settings=settings, data=data, resume=resume)
        if tunable.trials_on_pools:
            from raymodel.jobs import server

            server()  # trials with several workers run as jobs of the training server, on pools
        return tunable.fit()

    @overload
    def release(
        self,
        *,
        data: Any = None,
        settings: TrainSettings | Mapping[str, Any] | None = None,
        tune: TuneSettings | Mapping[str, Any] | None = None,
        space: Mapping[str, Any] | None = None,
        register: str,
        gate: Gate | Mapping[str, Any],
        route: str | None = None,
        rollout: RolloutPlan | Mapping[str, Any] | None = None,
        registry: str | None = None,
        wait: Literal[True] = True,
    ) -> ReleaseResult: ...

    @overload
    def release(
        self,
        *,
        data: Any = None,
        settings: TrainSettings | Mapping[str, Any] | None = None,
        tune: TuneSettings | Mapping[str, Any] | None = None,
        space: Mapping[str, Any] | None = None,
        register: str,
        gate: Gate | Mapping[str, Any],
        route: str | None = None,
        rollout: RolloutPlan | Mapping[str, Any] | None = None,
        registry: str | None = None,
        wait: Literal[False],
    ) -> Job: ...

    @overload
    def release(
        self,
        *,
        data: Any = None,
        settings: TrainSettings | Mapping[str, Any] | None = None,
        tune: TuneSettings | Mapping[str, Any] | None = None,
        space: Mapping[str, Any] | None = None,
        register: str,
        gate: Gate | Mapping[str, Any],
        route: str | None = None,
        rollout: RolloutPlan | Mapping[str, Any] | None = None,
        registry: str | None = None,
        wait: bool = True,
    ) -> ReleaseResult | Job: ...

    def release(
        self,
        *,
        data: Any = None,
        settings: TrainSettings | Mapping[str, Any] | None = None,
        tune: TuneSettings | Mapping[str, Any] | None = None,
        space: Mapping[str, Any] | None = None,
        register: str,
        gate: Gate | Mapping[str, Any],
        route: str | None = None,
        rollout: RolloutPlan | Mapping[str, Any] | None = None,
        registry: str | None = None,
        wait: bool = True,
    ) -> ReleaseResult | Job:
        """Train, gate, register, roll out and promote, as one durable job of the training server.

        Stages (each a row of ``job.history()`` with ``"stage"``, its start, end and figures):
        **train** as ``train(settings, data=...)`` (or, with ``tune``, as ``tune(space, settings=tune,
        data=...)``: the best trial's checkpoint is the candidate); **evaluate**: the candidate and the version
        ``gate.against`` names are scored on the same held-out data (the data's ``valid`` split, or
        ``gate.data``) in the cluster; one that does not pass ends the job ``REJECTED`` and nothing
        is registered; **register** as ``register`` (its lineage names the job, the parent version
        and both figures); **rollout** on ``route`` (``rm.RolloutPlan``: steps, guarded): a breach
        ends it ``ROLLED_BACK``, the route serving what it served, and a stop by another hand than
        ``job.stop()`` (``rollout.stop()``) ends it ``FAILED``; **promote**: ``gate.against``'s
        alias names the new version. docs/releases.md says more.

        Args:
            data: As for ``train``, with a ``valid`` split (unless ``gate.data`` is given).
            settings: A ``TrainSettings`` or a dict of its fields (a release trains in a one-off run).
            tune: A ``TuneSettings`` (or a dict) instead of ``settings``: the release tunes first.
            space: With ``tune``: the search space (default: ``hyperparameter_space()``).
            register: ``"KEY"`` or ``"KEY@ALIAS"``: where the candidate goes, once it passes the gate.
            gate: ``rm.Gate(metric=..., mode=..., min_delta=..., against="KEY@production")``.
            route: A route that serves ``against``'s alias (``rm.Servable('digits@production',
                '/digits').deploy()``); ``None``: no rollout, the alias moves once registered.
            rollout: ``rm.RolloutPlan(steps=..., step_s=..., guard=rm.Guard(...))``.
            registry: The registry (default: ``RAYMODEL_REGISTRY`` or ``$RAYMODEL_HOME/registry``).
            wait: Block, printing each row and stage as it comes, and return the ``ReleaseResult``
                (the default, as for ``train`` and ``tune``); ``False``: return the ``Job`` at once.

        Returns:
            The ``ReleaseResult`` (status, reason, version, stages), or with ``wait=False`` a ``Job``
            of kind ``"release"`` (``job.stage``, ``job.status``, ``job.wait()``).

        Raises:
            SettingsError / DataError: bad input (a gate metric the model does not report, ``against``
                naming no version, a route not served, steps not ending at 1.0), before anything runs.
        """
        from raymodel.jobs import follow_release, submit_release

        job = submit_release(
            self,
            data=data,
            settings=settings,
            tune=tune,
            space=space,
            register=register,
            gate=gate,
            route=route,
            rollout=rollout,
            registry=registry,
        )
        return follow_release(job) if wait else job

    def serve(self, route: str = "/", *, settings: ServeSettings | Mapping[str, Any] | None = None) -> ServedModel:
        """Serve this instance's current weights over HTTP with Ray Serve.

        Example:
            >>> app = model.serve("/digits")
            >>> requests.post(app.url, json={"pixels": X[:1].tolist()}).json()
        """
        from raymodel.serve import Servable

        return Servable(self, route, settings=settings).deploy()

    def predict_batch(self, data: Any, **options: Any) -> Predictions:
        """Score a data set with this instance's current weights on a pool of Ray Data actors.

        Each actor loads the model once (from a checkpoint of these weights) and
        runs ``predict_batch_preprocess -> forward -> predict_batch_postprocess``
        on each batch. Nothing runs until the result is read or written.

        Args:
            data: A ``ray.data.Dataset``, a numpy array of rows, a pandas
                DataFrame, or the location (path or URI) of Parquet or CSV files.
            **options: ``batch_size``, ``concurrency``, ``num_cpus``, ``num_gpus``,
                ``feature_columns``, ``keep_columns``, ``preserve_order``: see
                ``raymodel.predict_batch``.

        Returns:
            ``Predictions``, a ``ray.data.Dataset`` of the
            output columns, rows in the input's order.

        Example:
            >>> model.predict_batch(X_test).to_numpy()["prediction"]
            >>> model.predict_batch("s3://bucket/features/").write_parquet("s3://bucket/scores/")
        """
        from raymodel.predict import predict_batch

        return predict_batch(self, data, **options)

    # ---------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write this model (class, config, weights) as a checkpoint directory at ``path``.

        ``path`` is a local folder or a ``pyarrow.fs`` URI (``s3://bucket/models/digits``).
        The checkpoint appears whole or not at all: locally it is written beside
        the target and renamed into place; on an object store its manifest is
        uploaded last, and a folder without one is not a checkpoint.
        Returns the checkpoint's location.
        """
        self.ensure_setup()
        if storage.is_uri(os.fspath(path)):
            return self._save_to(os.fspath(path))
        target = Path(path).resolve()
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise CheckpointError(f"`{target}` already exists and is not an empty folder; choose a new path.")
        with tmp.replacing(target, ".raymodel-save") as staging:
            self._write_checkpoint(staging)
        return str(target)

    def _save_to(self, location: str) -> str:
        """``save`` to a URI: written locally, then uploaded with the manifest last (object stores
        have no rename), so a reader never takes a half-uploaded folder for a checkpoint."""
        try:
            if storage.listdir(location):
                raise CheckpointError(f"`{location}` already exists and is not empty; choose a new location.")
            with tmp.tempdir("save") as staging:
                self._write_checkpoint(staging)
                return storage.upload(staging, location, last=ckpt.MANIFEST)
        except (OSError, ValueError) as exc:  # pyarrow: unreachable store, unknown scheme, no bucket
            raise CheckpointError(f"Cannot write a checkpoint to `{location}`: {exc}") from exc

    def _write_checkpoint(self, directory: Path) -> None:
        state = self.backend.get_state(self)
        if not is_default(self, "on_save_checkpoint"):
            call_sync(self.on_save_checkpoint, state)
        ckpt.write(self, directory, state)

    @classmethod
    def from_checkpoint(cls: type[M], path: str | os.PathLike[str], config: Mapping[str, Any] | None = None) -> M:
        """Load a model (class, config, weights) from a checkpoint, in any process.

        The class travels inside the checkpoint, so a class defined in a script
        or notebook loads elsewhere. Every file's sha256 is checked before
        anything is unpickled.

        Args:
            path: The checkpoint folder (or a URI).
            config: Entries merged over the saved config before ``setup``.

        Raises:
            CheckpointError: not a checkpoint; ChecksumError: a file was changed.
        """
        return ckpt.load_model(path, config=config, base=cls)

    def load_weights(self, path: str | os.PathLike[str], *, _verified: dict[str, Any] | None = None) -> None:
        """Replace this instance's weights with a checkpoint's (same class and config shape)."""
        with ckpt.local_copy(path) as directory:
            manifest = _verified or ckpt.verify(directory)
            if manifest.get("backend") != self.backend.name:
                raise CheckpointError(
                    f"The checkpoint at `{path}` was written by the `{manifest.get('backend')}` backend; "
                    f"`{type(self).__name__}` uses `{self.backend.name}`."
                )
            self.ensure_setup()
            state = ckpt.read_state(self, directory)
            ckpt.set_state(self, state, manifest, path)
            self.input_signature = manifest.get("input_signature") or self.input_signature
            if not is_default(self, "on_load_checkpoint"):
                call_sync(self.on_load_checkpoint, state)
        self.source = {"checkpoint": os.fspath(path)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(config={self.config!r})"


def _predict_here(model: Any, payload: Any) -> Any:
    """``model.predict(payload)`` in this process, without Ray: the request checks a route makes (the declared
    schemas, the recorded input signature), then ``postprocess(forward(preprocess(payload)))`` in inference
    mode; ``DataError`` names what does not fit."""
    schemas = schemas_of(type(model))
    model.ensure_setup()
    checked, errors = schemas.check_input(payload)
    if errors:
        where = schemas.input.where if schemas.input is not None else "the input schema"
        raise DataError(f"The payload does not match `{where}`: {describe(errors)}")
    try:
        signature.check_payload(payload)
        x = model.preprocess(checked)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(
            f"`{type(model).__name__}.preprocess` cannot use the payload {_short(payload)} "
            f"(a {type(payload).__name__}): {type(exc).__name__}: {exc}"
        ) from exc
    if schemas.input is None:  # a declared input_schema wins over the recorded (or the model's own) signature
        signature.check(signature.of_model(model), x)
    with model.backend.inference.mode(model):
        try:
            out = model.forward(x)
        except Exception as exc:
            exc.add_note(
                f"raymodel: `forward` failed on the input made from the payload {_short(payload)} "
                f"(a {type(payload).__name__})."
            )
            raise
    output = model.postprocess(out)
    if schemas.output is not None:
        schemas.check_output(output)  # raises, naming each field that does not match
    return output


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (for error messages)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
