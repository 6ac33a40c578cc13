"""Experiment tracking: MLflow and TensorBoard, one tracked run per training run (or tune trial).

Both log from rank 0 only: the params once (the model config and the
``TrainSettings``), every epoch's metrics (step = epoch), and the final
checkpoint. A run that resumes after a worker failure continues the same
tracked run: MLflow finds it by the run's storage path (a tag), TensorBoard
writes on in the same folder, dropping any step past the resume point.
"""

from __future__ import annotations

import json
import time
from typing import Any

from raymodel.exceptions import MissingDependencyError, SettingsError
from raymodel.hooks import Callback

_TAG = "raymodel.run_path"


def _params(context: Any, config: dict[str, Any]) -> dict[str, str]:
    """The config and the settings as flat string params (``config.lr``, ``settings.batch_size``)."""
    out = {f"config.{k}": v for k, v in config.items()}
    settings = context.settings
    if settings is not None:
        fields = getattr(type(settings), "__dataclass_fields__", {})
        out.update({f"settings.{k}": getattr(settings, k) for k in fields if k != "callbacks"})
    return {k: str(v)[:500] for k, v in out.items()}


def _run_name(context: Any) -> str:
    return f"{context.name}-{context.trial_id}" if context.trial_id else context.name


class MLflowLogger(Callback):
    """Log each training run (or tune trial) to MLflow.

    Args:
        tracking_uri: An MLflow tracking URI (``"sqlite:///mlflow.db"``, ``"http://host:5000"``, a
            folder); ``None``: MLflow's default (``MLFLOW_TRACKING_URI``, else ``./mlruns``).
        experiment: The MLflow experiment (created when missing).
        log_checkpoint: Upload the final checkpoint as the run's ``checkpoint/`` artifacts.

    Needs ``pip install 'raymodel[tracking]'`` (mlflow-skinny; SQLAlchemy and Alembic for a
    SQLite store).
    """

    def __init__(
        self, tracking_uri: str | None = None, experiment: str = "raymodel", log_checkpoint: bool = True
    ) -> None:
        if not isinstance(experiment, str) or not experiment:
            raise SettingsError(f"MLflowLogger: `experiment` must be a non-empty name (got {experiment!r}).")
        self.tracking_uri, self.experiment, self.log_checkpoint = tracking_uri, experiment, log_checkpoint
        self.run_id: str | None = None
        self._client: Any = None

    def before_fit(self) -> None:
        if self.context.rank != 0:
            return
        try:
            from mlflow import MlflowClient
        except ImportError as exc:
            raise MissingDependencyError("MLflowLogger needs MLflow: pip install 'raymodel[tracking]'") from exc
        client = self._client = MlflowClient(self.tracking_uri)
        experiment_id = self._experiment_id(client)
        key = self.context.storage_path
        found = client.search_runs([experiment_id], filter_string=f"tags.`{_TAG}` = '{_quoted(key)}'", max_results=1)
        if found:  # this run resumed after a failure: the same tracked run goes on
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
            return
        tags = {_TAG: key, "raymodel.model_class": type(self.model).__qualname__}
        if self.context.trial_id:
            tags["raymodel.trial_id"] = self.context.trial_id
        self.run_id = client.create_run(experiment_id, run_name=_run_name(self.context), tags=tags).info.run_id
        from mlflow.entities import Param

        client.log_batch(self.run_id, params=[Param(k, v) for k, v in _params(self.context, self.model.config).items()])

    def after_epoch(self, epoch: int, metrics: dict[str, Any]) -> None:
        if self.run_id is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, epoch) for k, v in metrics.items()])

    def after_fit(self, result: dict[str, Any]) -> None:
        if self.run_id is None:
            return
        if self.log_checkpoint and result.get("checkpoint"):
            from raymodel._internal import storage

            with storage.local_folder(result["checkpoint"], "ckpt") as directory:
                self._client.log_artifacts(self.run_id, str(directory), "checkpoint")
            self._client.set_tag(self.run_id, "raymodel.checkpoint", result["checkpoint"])
        self._client.set_terminated(self.run_id)

    def _experiment_id(self, client: Any) -> str:
        for _ in range(3):  # trials starting together may race to create it
            found = client.get_experiment_by_name(self.experiment)
            if found is not None:
                return found.experiment_id
            try:
                return client.create_experiment(self.experiment)
            except Exception:  # noqa: BLE001 - created by another trial meanwhile: look again
                time.sleep(0.2)
        raise SettingsError(f"MLflowLogger: could not open or create experiment `{self.experiment}`.")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}


class TensorBoardLogger(Callback):
    """Write each training run (or tune trial) as a TensorBoard run under ``log_dir``.

    One folder per run: ``<log_dir>/<run name>[-<trial id>]``, with every epoch's metrics as
    scalars (step = epoch), the config and settings as text, and the final checkpoint's
    location. ``tensorboard --logdir <log_dir>`` shows them. Each epoch is on disk when the
    epoch ends (written synchronously), so a worker that dies loses nothing it logged; a
    resumed run marks its resume point, and TensorBoard hides any later step of the attempt
    before.
    """

    def __init__(self, log_dir: str) -> None:
        if not isinstance(log_dir, str) or not log_dir:
            raise SettingsError(f"TensorBoardLogger: `log_dir` must be a folder path (got {log_dir!r}).")
        self.log_dir = log_dir
        self._writer: Any = None

    def before_fit(self) -> None:
        if self.context.rank != 0:
            return
        import os

        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.summary import text

        folder = os.path.join(self.log_dir, _run_name(self.context))
        os.makedirs(folder, exist_ok=True)
        self._writer = EventsWriter(os.path.join(folder, "events"), f".{os.getpid()}")
        resumed = self.context.resumed_from
        if resumed:  # TensorBoard's purge: steps from here on, written before the failure, are hidden
            self._write(Event(step=resumed + 1, session_log=SessionLog(status=SessionLog.START)))
        else:
            self._write(
                Event(step=0, summary=text("params", json.dumps(_params(self.context, self.model.config), indent=1)))
            )

    def after_epoch(self, epoch: int, metrics: dict[str, Any]) -> None:
        if self._writer is None:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        for key, value in metrics.items():
            self._write(Event(step=epoch, summary=scalar(key, float(value))))

    def after_fit(self, result: dict[str, Any]) -> None:
        if self._writer is None:
            return
        if result.get("checkpoint"):
            from tensorboardX.proto.event_pb2 import Event
            from tensorboardX.summary import text

            self._write(Event(step=len(result.get("history", [])), summary=text("checkpoint", result["checkpoint"])))
        self._writer.close()
        self._writer = None

    def _write(self, event: Any) -> None:
        event.wall_time = time.time()
        self._writer.write_event(event)
        self._writer.flush()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_writer": None}


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")
