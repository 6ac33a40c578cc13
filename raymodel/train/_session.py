"""``TrainSession``: where a run is placed when it is a Ray Train V2 worker."""

from __future__ import annotations

from typing import Any


class TrainSession:
    """Where a run is placed: a Ray Train V2 worker (rank, reports, checkpoints).

    A session answers: rank, world, local_rank, ``latest_checkpoint()``,
    ``report(metrics, checkpoint_dir, name)``, ``broadcast(value)``, ``barrier()``,
    ``settings_changed(settings)`` (``job.update`` changed them at an epoch boundary).
    The other placement is a Tune trial's own process (``tune/_trial.py``).
    """

    #: A worker of a Ray Train worker group: the framework's distributed setup (DDP, a strategy's
    #: cluster) comes from Ray Train. (A backend's ``training`` says whether its runs are such groups: a ``RayTrain``.)
    in_worker_group = True

    def __init__(self) -> None:
        import ray.train

        context = ray.train.get_context()
        self.rank: int = context.get_world_rank()
        self.world: int = context.get_world_size()
        self.local_rank: int = context.get_local_rank()

    def latest_checkpoint(self) -> Any:
        import ray.train

        return ray.train.get_checkpoint()

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, name: str) -> None:
        import ray.train

        checkpoint = None if checkpoint_dir is None else ray.train.Checkpoint.from_directory(checkpoint_dir)
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name)

    def broadcast(self, value: Any) -> Any:
        from ray.train.collective import broadcast_from_rank_zero

        return broadcast_from_rank_zero(value)

    def barrier(self) -> None:
        from ray.train.collective import barrier

        barrier()

    def settings_changed(self, settings: Any) -> None:
        """Ray Train's ``CheckpointConfig`` is fixed for the run (the server refuses ``keep_checkpoints``
        changes of such a run); nothing else here depends on the settings."""


class LocalSession:
    """Where a run is placed when it is one worker in one process of raymodel's own (a Tune trial's
    process, the actor an RLlib Algorithm runs in): rank 0 of 1, checkpoints written straight into the
    run's storage, each report handed to ``deliver``.

    A checkpoint is written beside its final name and renamed into place (on an object store the
    manifest goes up last), so it appears whole or not at all, as Ray Train's upload would leave it;
    with ``keep`` only the newest ``keep`` stay.
    """

    rank, world, local_rank = 0, 1, 0
    in_worker_group = False  # one process of its own: no Ray Train context

    def __init__(self, run_path: str, keep: int | None = None) -> None:
        from raymodel._internal import storage

        self.run_path, self.keep = run_path, keep
        storage.ensure_dir(run_path)

    def latest_checkpoint(self) -> Any:
        return None  # the run's folder (and a checkpoint handed over) are where resumes come from

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, name: str) -> None:
        location = None
        if checkpoint_dir is not None:
            location = self._persist(checkpoint_dir, name)
        self.deliver(dict(metrics, **({"checkpoint_path": location} if location else {})))

    def deliver(self, row: dict[str, Any]) -> None:
        """A report's row (with ``checkpoint_path`` when it wrote one), for whoever follows the run."""

    def broadcast(self, value: Any) -> Any:
        return value

    def barrier(self) -> None:
        pass

    def settings_changed(self, settings: Any) -> None:
        self.keep = settings.keep_checkpoints

    def _persist(self, source: str, name: str) -> str:
        import os
        import shutil
        from pathlib import Path

        from raymodel._internal import storage
        from raymodel.contract.checkpoint import MANIFEST, epoch_of

        target = storage.join(self.run_path, name)
        if storage.is_uri(target):  # no rename on object stores: the manifest goes up last
            storage.delete(target)
            storage.upload(Path(source), target, last=MANIFEST)
        elif Path(source).resolve() != Path(target).resolve():
            staged = Path(self.run_path) / f".{name}.partial-{os.urandom(3).hex()}"
            shutil.copytree(source, staged)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staged, target)
        if self.keep:
            done = sorted(n for n in storage.listdir(self.run_path) if epoch_of(n) is not None)
            for old in done[: -self.keep]:
                storage.delete(storage.join(self.run_path, old))
        return target
